"""The dashboard's pure text helpers, tested without an App."""

from __future__ import annotations

import re

from factories import make_sample

from probes.records import StepSample
from probes.tools import units as u
from tui import format as f
from tui import format_panels as fp
from tui import panes as p


def test_sample_values_maps_every_pane_and_hides_nan_loss():
    values = p.sample_values(make_sample(3, loss=float("nan"), allocated_bytes=3 * 1024**2,
                                         driver_used_bytes=None))
    assert set(values) == set(p.PANE_IDS)
    assert values["loss"] is None
    assert values["driver"] is None
    assert values["allocated"] == 3 * 1024**2


def test_format_value_units_and_na():
    assert f.format_value("bytes", 1536) == "1.5 KiB"
    assert f.format_value("bytes", None) == "n/a"
    assert f.format_value("rate", 12345) == "12.3k"
    assert f.format_value("ms", 42.04) == "42.0 ms"
    assert f.format_value("ms", 2377) == "2377 ms"
    assert f.format_value("loss", 2.5) == "2.5000"
    assert f.format_scale(None) == "no scaler"
    assert f.format_scale(65536.0) == "65536"
    assert f.format_scale(2.0**24) == "2^24"


def test_cpu_labels_are_honest_and_short_labels_fit_a_compact_pane():
    cpu = p.pane_labels("cpu")
    assert cpu["allocated"] == "heap used" and cpu["driver"] == "RSS"
    assert cpu["peak"] == "heap peak"  # one name at every width; the help says it is sampled
    assert "sampled peak" in p._BY_ID["peak"].on("cpu").help
    assert p.pane_labels("cuda")["driver"] == "NVML used"
    for label in p.pane_labels("cpu", short=True).values():
        # 18 content columns at 80x24, minus a value such as "12.3 MiB" and a space
        assert len(label) <= 9, label


def test_label_value_line_fills_width_and_prefers_the_value():
    line = f.label_value_line("heap in use", "12.3 MiB", 30)
    assert len(line) == 30 and line.startswith("heap in use") and line.endswith("12.3 MiB")
    narrow = f.label_value_line("peak heap (sampled)", "125 MiB", 18, short_label="peak (s)")
    assert narrow.startswith("peak (s)") and narrow.endswith("125 MiB") and len(narrow) == 18
    assert f.label_value_line("x", "a very long value", 5) == "a ve…"


def test_range_text_uses_the_longest_form_that_fits():
    mib = 1024**2
    assert f.range_text("bytes", 11 * mib, 13 * mib, 40) == "min 11.0 MiB  max 13.0 MiB"
    short = f.range_text("bytes", 11 * mib, 13 * mib, 18)
    assert short == "11.0–13.0 MiB"
    assert len(short) <= 18
    # every width: a "min X max Y" text gives both values their unit (issue 30, item 10)
    for width in range(8, 40):
        text = f.range_text("bytes", 99.7 * mib, 201 * mib, width)
        if text.startswith("min "):
            assert re.fullmatch(r"min [\d.]+ MiB {1,2}max [\d.]+ MiB", text), text
        assert len(text) <= width
    assert f.range_text("loss", None, None, 20) == "min/max n/a"
    for width in (6, 10, 14):
        assert len(f.range_text("bytes", 1, 10 * mib, width)) <= width


def test_clock_duration_and_count():
    assert u.format_clock(59) == "0:59" and u.format_clock(3725) == "1:02:05"
    assert u.format_clock(None) == "n/a"
    assert u.format_duration(30) == "30 s"
    assert u.format_duration(7260) == "2 h 1 min"
    assert u.format_count(842496) == "0.84M"
    assert u.format_steps(950) == "950" and u.format_steps(12500) == "12k"
    assert u.format_us(1500) == "1.50 ms" and u.format_us(None) == "n/a"
    assert u.format_us(None, na="-") == "-"


def test_leak_alert_line_says_rate_since_and_time_to_full():
    data = {"counter": "host_heap", "bytes_per_step": 150 * 1024, "since_step": 40,
            "window_steps": 20, "capacity_bytes": 16 * 1024**3, "steps_to_full": 110000,
            "seconds_to_full": 5400.0, "hint": "log loss.item()", "fill_counter": "host RSS",
            "limit_name": "host RAM available", "fill_bytes_per_step": 150 * 1024}
    line = fp.leak_alert_line(data, 50)
    assert "host heap" in line and "150 KiB/step" in line and "since step 40" in line
    assert "16.0 GiB" in line and "1 h 30 min" in line and "~110k steps" in line
    assert "host RSS fills host RAM available" in line  # what fills, not what leaks
    lines, hint = fp.leak_banner_text({"host_heap": data})
    assert hint == "log loss.item()" and lines == line
    compact = fp.leak_alert_line(data, 50, compact=True)
    assert len("LEAK: " + compact) <= 78  # one line on an 80-column terminal
    assert "+150 KiB/step" in compact and "since step 40" in compact and "1 h 30 min" in compact
    # RSS filling far faster than the heap leaks (a fragmented heap): the banner said only
    # "+150 KiB/step" beside panes growing MiB a step; now both rates, still on one line
    fast = dict(data, since_step=12345, fill_bytes_per_step=int(3.6 * 1024**2))
    compact = fp.leak_alert_line(fast, 12400, compact=True)
    assert compact == "heap +150 KiB/step; RSS +3.6 MiB/step fills RAM in 1 h 30 min"
    early = fp.leak_alert_line(dict(fast, since_step=40, seconds_to_full=600.0), 50, True)
    assert early == "heap +150 KiB/step since 40; RSS +3.6 MiB/step fills RAM in 10 min"
    assert len("LEAK: " + compact) <= 78


def test_counter_pane_mapping_per_device():
    assert p.counter_pane("host_heap", "cpu") == "allocated"
    assert p.counter_pane("host_rss", "cpu") == "driver"
    assert p.counter_pane("device_allocated", "cuda") == "allocated"
    assert p.counter_pane("host_heap", "cuda") is None


OPS = [
    {"name": "aten::mm", "calls": 10, "self_cpu_us": 300.0, "cpu_total_us": 310.0,
     "self_device_us": None, "device_total_us": None, "cpu_memory_bytes": None,
     "device_memory_bytes": None},
    {"name": "aten::copy_", "calls": 900, "self_cpu_us": 250.0, "cpu_total_us": 500.0,
     "self_device_us": None, "device_total_us": None, "cpu_memory_bytes": None,
     "device_memory_bytes": None},
    {"name": "autograd::engine::evaluate_function: ScaledDotProductAttentionBackward0",
     "calls": 2, "self_cpu_us": 5.0, "cpu_total_us": None, "self_device_us": None,
     "device_total_us": None, "cpu_memory_bytes": None, "device_memory_bytes": None},
]


def test_op_columns_hide_what_was_not_measured_and_sort_cycles():
    cols = fp.op_columns(OPS)
    assert cols == ["calls", "self_cpu_us", "cpu_total_us"]
    key = fp.default_sort_key("cpu", cols)
    assert key == "cpu_total_us"
    assert fp.default_sort_key("device", cols) == "cpu_total_us"  # no device column here
    assert [op["name"] for op in fp.sort_ops(OPS, key)][:2] == ["aten::copy_", "aten::mm"]
    assert fp.sort_ops(OPS, key)[-1]["cpu_total_us"] is None  # missing values sort last
    seen = [key]
    for _ in range(len(cols)):
        seen.append(fp.next_sort_key(seen[-1], cols))
    assert seen[-1] == key and set(seen) == set(cols)


def test_shorten_op_keeps_width_and_meaningful_ends():
    name = OPS[2]["name"]
    short = fp.shorten_op(name, 30)
    assert len(short) <= 30 and short.startswith("bwd: ") and short.endswith("Backward0")
    assert fp.shorten_op("aten::mm", 30) == "aten::mm"
    assert len(fp.shorten_op("x" * 100, 12)) == 12


def test_ledger_rows_and_footer():
    data = {"lines": [{"name": "parameters", "measured_bytes": 1024, "predicted_bytes": 1024,
                       "formula": "P × 4 B", "note": ""},
                      {"name": "allocator cache", "measured_bytes": 2048,
                       "predicted_bytes": None, "formula": "", "note": "reserved − allocated"}],
            "total_measured_bytes": 1024, "allocated_bytes": 4096, "reserved_bytes": 8192,
            "sampled_step": 7}  # the total counts exact tensor lines only, not the cache
    rows = fp.ledger_rows(data)
    assert rows[0] == ("parameters", "1.0 KiB", "1.0 KiB", "P × 4 B")
    assert rows[1] == ("allocator cache", "2.0 KiB", "-", "reserved − allocated")
    footer = fp.ledger_footer(data)
    assert "step 7" in footer and "8.0 KiB" in footer
    assert "heap used 4.0 KiB" in footer and "at end of forward (panes: end of step)" in footer
    cuda = fp.ledger_footer(dict(data, device="cuda:0"))
    assert "allocated 4.0 KiB" in cuda and "reserved 8.0 KiB" in cuda
    # named for what it sums (the tensor lines), not "total" of every line above it
    assert footer.startswith("tensors 1.0 KiB ·") and "total" not in footer


def test_downsample_max_keeps_spikes_and_bounds_points():
    values = [1.0] * 1000
    values[537] = 99.0
    out = fp.downsample_max(values, 80)
    assert len(out) == 80 and max(out) == 99.0
    assert fp.downsample_max([1.0, 2.0], 80) == [1.0, 2.0]
    assert fp.byte_unit(3 * 1024**3) == ("GiB", 1024.0**3)
    assert fp.byte_unit(300 * 1024**2)[0] == "MiB"


def _cuda_notes(sample: StepSample) -> dict[str, str | None]:
    """The notes under the reserved and driver panes (tui/panes.py)."""
    return {"reserved": p.cache_free_note(sample, {}), "driver": p.outside_cache_note(sample, {})}


def test_cuda_notes_show_cache_and_driver_overhead():
    mib = 1 << 20
    base = dict(allocated_bytes=400 * mib, reserved_bytes=2048 * mib,
                driver_used_bytes=2600 * mib, amp="fp16", device="cuda:0", alloc_retries=2)
    notes = _cuda_notes(make_sample(9, **base))
    assert notes["reserved"] == "cache free 1.6 GiB, 2 malloc retries"
    assert notes["driver"] == "ctx+libs 552 MiB (NVML − reserved)"
    cpu = _cuda_notes(make_sample(9, **dict(base, device="cpu")))  # no CUDA note on CPU;
    # RSS 300 B under heap held 2 GiB: its own note (test_panes.py)
    assert cpu == {"reserved": "2.0 GiB above RSS: not resident", "driver": None}
    none = _cuda_notes(make_sample(9, **dict(base, driver_used_bytes=None, alloc_retries=0)))
    assert none == {"reserved": "cache free 1.6 GiB", "driver": None}


def test_sparkline_bars_scale_min_to_max_and_fit_the_width():
    from tui.charts import SPARK_BARS, bar_levels, bar_runs

    assert bar_levels([], 10) == [] and bar_levels([1.0, 2.0], 0) == []
    levels = bar_levels([0.0, 1.0, 2.0, 7.0], 4)
    assert levels == [0, 1, 2, 7]  # the largest value gets the tallest bar
    assert "".join(SPARK_BARS[v] for v in levels) == "▁▂▃█"
    assert bar_levels([5.0, 5.0, 5.0], 3) == [0, 0, 0]  # flat: no extent, lowest bars
    # more points than cells: each cell shows the largest of its share
    assert bar_levels([0.0, 9.0, 1.0, 2.0, 3.0, 0.0], 3) == [7, 1, 2]  # maxima 9, 2, 3
    # fewer points than cells: stretched, as Textual's Sparkline draws them
    assert bar_levels([0.0, 1.0], 4) == [0, 0, 7, 7]
    assert bar_runs([0, 0, 7, 7, 7, 3]) == [(0, 2), (7, 3), (3, 1)]
    assert sum(n for _, n in bar_runs(bar_levels(list(range(100)), 26))) == 26


def test_fit_lines_wraps_and_marks_what_it_cut():
    text = "LEAK: host heap +152 KiB/step\ncause: " + "word " * 80
    cut = f.fit_lines(text, 78, 4)
    lines = cut.split("\n")
    assert len(lines) == 4 and all(len(ln) <= 78 for ln in lines) and lines[-1].endswith("…")
    assert f.fit_lines("short\ntext", 78, 4) == "short\ntext"  # nothing cut, no "…"


def test_sparkline_draws_sub_percent_jitter_flat_and_says_its_window():
    from tui.charts import SPARK_FLAT_FRACTION, bar_levels, spark_rule

    mib = 1024**2
    jitter = [137 * mib + d for d in (0, 200_000, 400_000, 300_000, 600_000, 700_000)]
    assert max(jitter) - min(jitter) < SPARK_FLAT_FRACTION * max(jitter)
    assert bar_levels(jitter, 6) == [0] * 6  # the issue's ▁▃▄▄▆▇█ from sub-MiB noise
    grow = [137 * mib + i * 4 * mib for i in range(6)]  # a real trend still rises
    assert bar_levels(grow, 6)[-1] == 7 and bar_levels(grow, 6)[0] == 0
    rule = spark_rule(512)
    assert "last 512 steps" in rule and "1%" in rule


def test_key_roles_offer_only_keys_that_do_something():
    from tui.key_roles import ENDED, TRAIN, VIEW, action_shown, keys_for
    from tui.widgets.help_screen import KEYS

    def keys(role):
        return dict(keys_for(KEYS, role))

    assert "x" not in keys(TRAIN) and not action_shown("stop_run", TRAIN)
    assert "goes on" in keys(VIEW)["q"] and "x" in keys(VIEW) and action_shown("stop_run", VIEW)
    ended = keys(ENDED)
    assert not {"p", "l", "space", "x", "w", "m"} & set(ended) and "ended" in ended["q"]
    assert not action_shown("profile", ENDED) and action_shown("report", ENDED)
    assert not action_shown("who_holds", ENDED)  # a finished run has no one to look
    # space says what it will do: "pause" while running, "resume" while paused
    assert action_shown("pause", TRAIN) and not action_shown("resume", TRAIN)
    assert action_shown("resume", VIEW, paused=True) and not action_shown("pause", VIEW, True)
    assert not action_shown("resume", ENDED, paused=True)


def test_headless_step_lines_fit_80_columns_at_their_widest():
    """issue 30: headless step lines were 128 columns and wrapped at 80. The widest case: a
    six-digit step, fp16 on CUDA with a scaler that skipped steps, traced, leak demo on,
    every counter in GiB."""
    from factories import make_sample

    from tui.headless import format_step_line

    gib = int(123.45 * 2**30)
    widest = make_sample(123456, loss=12.3456, tokens_per_s=123_456.0, step_ms=12345.6,
                         device="cuda:0", amp="fp16", scale=65536.0, skipped_steps=123,
                         profiling=True, leak_active=True, allocated_bytes=gib,
                         reserved_bytes=gib, peak_allocated_bytes=gib, driver_used_bytes=gib)
    for sample in (widest, make_sample(7)):
        lines = format_step_line(sample).splitlines()
        assert len(lines) == 2 and all(len(ln) <= 80 for ln in lines), lines
    first, memory = format_step_line(widest).splitlines()
    assert "scale 65536" in first and "skipped 123" in first
    assert memory.split() == ["allocated", "123", "GiB", "reserved", "123", "GiB", "peak",
                              "123", "GiB", "NVML", "used", "123", "GiB"]
    assert "scale" not in format_step_line(make_sample(7))  # no scaler on CPU: no column


def test_op_columns_give_way_to_the_name_but_never_the_sort_column():
    from tui.format_panels import OP_COLUMN_CELLS, OP_NAME_MIN, visible_op_columns

    cols = ["calls", "self_cpu_us", "cpu_total_us", "cpu_memory_bytes"]
    wide = 4 + OP_NAME_MIN + OP_COLUMN_CELLS * len(cols)
    assert visible_op_columns(cols, "cpu_total_us", wide) == cols
    two = visible_op_columns(cols, "cpu_memory_bytes", wide - OP_COLUMN_CELLS * 2)
    assert two == ["calls", "cpu_memory_bytes"]  # the sort column kept, the order kept
    assert visible_op_columns(cols, "cpu_memory_bytes", 10) == ["cpu_memory_bytes"]


def test_footer_descriptions_fit_the_row_and_mark_every_cut():
    keys = [("p", "profile"), ("l", "leak"), ("space", "pause"), ("r", "report"), ("s", "svg"),
            ("o", "sort"), ("v", "view"), ("w", "who holds"), ("?", "help"), ("q", "quit")]
    assert f.footer_width(keys) == 83  # Textual cut this row at 80 columns to "… q q"
    assert f.footer_descriptions(keys, 100) == [d for _, d in keys]
    short = f.footer_descriptions(keys, 80)
    assert short[0] == "prof" and short[7] == "who" and short[-1] == "quit"
    for width in (80, 70, 60, 50):
        descs = f.footer_descriptions(keys, width)
        assert f.footer_width(list(zip([k for k, _ in keys], descs, strict=True))) <= width
        assert all(d in (full, f.FOOTER_SHORT.get(full)) or d.endswith("…")
                   for d, (_, full) in zip(descs, keys, strict=True)), descs


def test_ranges_sort_after_every_op():
    """A training window's ranges (ProfilerStep*, forward, backward: their totals hold their
    ops') topped the table by CPU total, and a short top-ops box showed nothing else."""
    from tui.format_panels import sort_ops

    rows = [{"name": "ProfilerStep*", "cpu_total_us": 270.0, "self_cpu_us": 1.0,
             "user_annotation": True},
            {"name": "backward", "cpu_total_us": 157.0, "self_cpu_us": 2.0,
             "user_annotation": True},
            {"name": "aten::mm", "cpu_total_us": 72.0, "self_cpu_us": 70.0,
             "user_annotation": False},
            {"name": "aten::bmm", "cpu_total_us": 29.0, "self_cpu_us": 29.0}]
    assert [r["name"] for r in sort_ops(rows, "cpu_total_us")] == [
        "aten::mm", "aten::bmm", "ProfilerStep*", "backward"]
    assert [r["name"] for r in sort_ops(rows, "self_cpu_us")][:2] == ["aten::mm", "aten::bmm"]


def test_help_key_lines_wrap_under_their_text():
    """The help's long key lines went on at column 0, under the keys."""
    from tui.key_roles import keys_for
    from tui.widgets.help_screen import KEYS, keys_markup

    col = max(len(key) for key, _ in keys_for(KEYS, "train")) + 2  # where the texts start
    plain = keys_markup("train", width=60).replace("[b]", "").replace("[/b]", "").split("\n")
    assert len(plain) > len(KEYS) and all(len(ln) <= 60 for ln in plain)
    more = [ln for ln in plain if ln[:1] == " "]  # a key's text going on
    assert more and all(ln[:col].strip() == "" and ln[col] != " " for ln in more)
    assert len(keys_markup("train").split("\n")) == len(KEYS)  # no width: one line a key


def test_a_profiler_window_is_named_by_its_traced_steps_everywhere():
    """'top ops · rank 0 · step 55' above 'profiles/step-50/rank-0' read as two windows
    (issue 44): the title, the toast, the status line and the headless line all say the steps
    the table sums; the folder keeps the step the window opened at."""
    from probes import records as R

    done = {"dir": "profiles/step-50/rank-0", "steps": [52, 53, 54], "first_step": 50,
            "top_ops": [{"name": "aten::mm", "calls": 3}]}
    assert R.window_steps(done) == (52, 54) and R.window_opened(done) == 50
    assert R.window_name(R.window_steps(done)) == "steps 52–54"
    assert R.window_name(R.window_steps({"steps": [7]})) == "step 7"
    started = {"step": 50, "wait": 1, "warmup": 1, "active": 3}  # an old row: planned steps
    assert R.window_steps({"dir": "profiles/step-50"}, started) == (52, 54)
    assert R.window_opened({"dir": "profiles/step-50/rank-0"}) == 50
    assert R.window_name(None, 57) == "ready at step 57"
    line = R.EVENT_KINDS[R.PROFILE_DONE].summary(done)
    assert line.startswith("steps 52–54 (profiles/step-50/rank-0)") and "aten::mm" in line
    assert f.profile_text(None, False, True, "steps 52–54") == "profiler: done, steps 52–54"


def test_the_top_ops_title_gives_way_from_its_end_and_is_never_cut_mid_word():
    """At 100 columns the title was cut mid-word ("… · +2 col…", issue 38)."""
    from tui.format_panels import ops_title

    full = ops_title("top ops · rank 0", "steps 52–54", "self CPU", 2, 200)
    assert full == "top ops · rank 0 · steps 52–54 · by self CPU (o) · +2 cols if wider"
    for width in range(10, 100):
        title = ops_title("top ops · rank 0", "steps 52–54", "self CPU", 2, width)
        assert len(title) <= width, (width, title)
        if width >= len("top ops · rank 0 · steps 52–54"):  # below: cut with its mark
            assert not title.endswith(("co", "col", "…", "wi", "wid")), (width, title)
        if width >= len("top ops · rank 0 · steps 52–54 · +2 cols"):  # the hint stays
            assert title.startswith("top ops · rank 0 · steps 52–54") and "+2 cols" in title
    assert ops_title("top ops", "step 9", "calls", 0, 80) == "top ops · step 9 · by calls (o)"


def test_the_banner_says_its_time_to_full_is_the_latest_and_the_report_the_alerts():
    """The report gave the fill rate at the alert, the dashboard the latest, and neither said
    which (issue 38)."""
    from probes.analysis.report.sections.leaks import forecast_line

    data = {"counter": "host_heap", "bytes_per_step": 150 * 1024, "since_step": 40,
            "capacity_bytes": 16 * 1024**3, "steps_to_full": 1000, "seconds_to_full": 600.0,
            "fill_counter": "host RSS", "limit_name": "host RAM available",
            "fill_bytes_per_step": 150 * 1024}
    assert fp.leak_alert_line(data, 50, when="now").endswith("in ~1000 steps / 10 min (now)")
    compact = fp.leak_alert_line(data, 50, compact=True, when="now")
    assert compact.endswith("(now)") and len("LEAK: " + compact) <= 78
    lines, _ = fp.leak_banner_text({"host_heap": data}, when="at the run's end")
    assert lines.endswith("(at the run's end)")
    no_eta = {k: v for k, v in data.items() if k not in ("steps_to_full", "seconds_to_full")}
    assert "(now)" not in fp.leak_alert_line(no_eta, 50, when="now")  # nothing to qualify
    line = forecast_line([{"step": 60, **data}])
    assert "at the alert" in line and "banner shows the latest" in line


def test_a_pane_note_gives_up_its_qualifiers_before_its_figures():
    """"workers 2 · +791 M" at 80 columns read as a cut number (user pass)."""
    assert f.fit_note("workers 2 · +791 MiB (PSS)", 30) == "workers 2 · +791 MiB (PSS)"
    assert f.fit_note("workers 2 · +791 MiB (PSS)", 18) == "workers 2 +791 MiB"
    assert f.fit_note("200 MiB above RSS: not resident", 18) == "200 MiB above RSS"
    assert f.fit_note("cache free 1.6 GiB, 2 malloc retries", 18) == "cache free 1.6 GiB"
    assert f.fit_note("ctx+libs 552 MiB (NVML − reserved)", 18) == "ctx+libs 552 MiB"
    assert f.fit_note("a note with no qualifier at all", 10) == "a note wi…"
