"""The module memory table: its text from a window's event (plain functions, no App), and the
`a` key on a real run, in `memtop train` and in `memtop view`, at 80×24 and 120×40."""

from __future__ import annotations

import pytest
from factories import events_named, wait_for

from probes import records as R
from probes.instruments.hooks import StepHook
from probes.records import Event
from probes.runfolder.state import RunState
from tui.format_attribution import (
    attribution_text,
    ledger_check,
    short_name,
    shown_columns,
    table_lines,
    table_title,
)
from tui.key_roles import ENDED, action_shown
from tui.widgets.help_screen import keys_markup

MiB = 1024 * 1024


def row(name, acts=0, params=0, peak=None, scores=0, inputs=0, ms=0.0, grads=None, opt=None):
    return {"module": name, "params_bytes": params, "grads_bytes": params if grads is None
            else grads, "optimizer_bytes": 2 * params if opt is None else opt,
            "activations_bytes": acts, "forward_peak_bytes": peak, "calls": 1,
            "weight_copies_bytes": 0, "scores_bytes": scores, "input_bytes": inputs,
            "forward_ms": ms, "checkpointed": False}


def window(**extra):
    modules = [row("", acts=4 * MiB, peak=40 * MiB, ms=20.0),
               row("transformer", peak=30 * MiB), row("transformer.h", peak=30 * MiB),
               row("lm_head", acts=MiB // 2, params=MiB, peak=2 * MiB)]
    for i in range(4):
        modules += [row(f"transformer.h.{i}", peak=6 * MiB, inputs=MiB, ms=4.0),
                    row(f"transformer.h.{i}.attn", acts=3 * MiB, scores=2 * MiB,
                        params=MiB // 4, peak=5 * MiB),
                    row(f"transformer.h.{i}.mlp", acts=2 * MiB, params=MiB // 2, peak=3 * MiB)]
    data = {"steps": [31], "modules": modules, "unattributed_bytes": 0,
            "activations_total_bytes": 4 * MiB + MiB // 2 + 4 * 5 * MiB,
            "params_total_bytes": MiB + 4 * (MiB // 4 + MiB // 2),
            "grads_total_bytes": MiB + 4 * (MiB // 4 + MiB // 2),
            "optimizer_total_bytes": 2 * (MiB + 4 * (MiB // 4 + MiB // 2)),
            "step_peak_bytes": 100 * MiB, "model_class": "GPT", "seq_len": 128,
            "hints": ["transformer.h.*.attn keeps 49% of activations"]}
    data.update(extra)
    return data


def ledger(acts, params=None):
    params = params if params is not None else 4 * MiB
    return {"lines": [{"name": "parameters", "measured_bytes": params},
                      {"name": "gradients", "measured_bytes": params},
                      {"name": "optimizer state", "measured_bytes": 2 * params},
                      {"name": "saved activations", "measured_bytes": acts}]}


# ---- plain functions ----------------------------------------------------------------------------
def test_the_table_shows_blocks_sorted_by_activations_then_their_children():
    data = window()
    lines = table_lines(data, "activations_bytes", 78, ledger(data["activations_total_bytes"]))
    names = [ln.split()[0] for ln in lines[1:8]]
    assert names[:4] == [f"transformer.h.{i}" for i in range(4)]  # 5 MiB each: first
    assert "GPT" in names[4] and names[5] == "lm_head"
    assert "acts ▼" in lines[0] and all(len(ln) <= 78 for ln in lines)
    children = lines.index(next(ln for ln in lines if ln.startswith("their children")))
    assert "4 blocks transformer.h.*:" in lines[children]
    assert lines[children + 1].split()[0] == "*.attn"  # 12 MiB over the 4 blocks
    assert "12.0 MiB" in lines[children + 1]
    total = next(ln for ln in lines if ln.startswith("total"))
    assert "24.5 MiB" in total  # modules + not in a module = the event's total
    assert any(ln.startswith("ledger: params =, grads =, opt =, acts 24.5 MiB vs 24.5 MiB")
               for ln in lines)
    assert lines[-1] == "• transformer.h.*.attn keeps 49% of activations"


def test_sorting_by_the_forward_peak_and_narrow_columns():
    data = window()
    lines = table_lines(data, "forward_peak_bytes", 40)
    assert "fwd peak▼" in lines[0] and lines[1].split()[0] == "GPT"  # 40 MiB: the model
    assert all(len(ln) <= 40 for ln in lines)
    assert [c for c, _ in shown_columns(40, "params_bytes")] == ["params_bytes",
                                                                 "activations_bytes"]
    assert len(shown_columns(120, "activations_bytes")) == 6
    assert short_name("transformer.h.12.attn.c_proj", 14) == "…2.attn.c_proj"
    # every sort key `o` reaches marks its column and keeps it at any width ("by held" marked
    # none and could lose %peak at 80 columns)
    from probes.records.attribution import SORT_KEYS

    for key in SORT_KEYS:
        for width in (40, 76, 120):
            lines = table_lines(data, key, width)
            assert lines[0].count("▼") == 1, (key, width, lines[0])
    assert "%peak ▼" in table_lines(data, "held_bytes", 40)[0]


def test_the_ledger_line_says_what_does_not_reconcile():
    data = window()
    assert "✓" in ledger_check(data, ledger(int(data["activations_total_bytes"] * 1.04)))
    off = ledger_check(data, ledger(int(data["activations_total_bytes"] * 1.2), params=5 * MiB))
    assert "✗" in off and "params ≠ 5.0 MiB" in off
    assert ledger_check(data, None).startswith("ledger: not measured yet")


def test_missing_peaks_read_na_and_the_title_says_the_steps():
    data = window(steps=[31, 32], partial=True)
    lines = table_lines(dict(data, modules=[row("lm_head", acts=5)]), "activations_bytes", 78)
    assert "n/a" in lines[1]
    assert table_title(32, data, "forward_peak_bytes") == \
        "modules · steps 31–32 (partial) · by fwd peak (o)"


def test_status_text_and_key_roles():
    assert attribution_text("warm-up", False, True, None) == "modules: warm-up"
    assert attribution_text(None, True, True, None) == "modules: requested"
    assert attribution_text(None, False, True, 40) == "modules: done at step 40"
    assert attribution_text(None, False, False, None) == "modules: n/a"
    assert not action_shown("attribute", ENDED) and action_shown("attribute", "view")
    assert "a " in keys_markup("train") and "\na " not in "\n" + keys_markup(ENDED)


def test_run_state_follows_a_window():
    st = RunState()
    st.apply(Event(R.ATTRIBUTION_STARTED, 10, 1.0, {"warmup": 1, "steps": 2}))
    assert st.attribution_phase == "warm-up"
    from factories import make_sample
    st.apply(make_sample(10))
    assert st.attribution_phase == "measuring 1/2"
    st.apply(make_sample(11))
    assert st.attribution_phase == "measuring 2/2"
    st.apply(Event(R.MEMORY_ATTRIBUTION, 12, 1.2, {"steps": [11, 12], "modules": []}))
    assert st.attribution_phase is None and st.attribution_done_step == 12


# ---- the key on a real run -----------------------------------------------------------------------
class _Pace(StepHook):
    """Steps at a slow model's pace (~0.25 s), and which step first ended with the table on
    screen: the tiny model's ~5 ms steps are shorter than one frame."""

    def __init__(self, app_box: list) -> None:
        self.app_box = app_box
        self.shown_at: int | None = None

    def end_step(self, step, tensors, sample) -> None:
        import time

        app = self.app_box[0] if self.app_box else None
        if self.shown_at is None and app is not None and app.modules_table.loaded:
            self.shown_at = step
        time.sleep(0.25)


@pytest.mark.slow
@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_a_shows_the_table_within_two_steps_of_the_window_end(make_app, size):
    box: list = []
    pace = _Pace(box)
    app = make_app(extra_hooks=[pace])
    box.append(app)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.trainer.status.step >= 3, "the first steps")
        assert "a" in app.active_bindings
        await pilot.press("a")
        await wait_for(pilot, lambda: "modules:" in app.status_line.text, "the status line")
        await wait_for(pilot, lambda: app.modules_table.loaded, "the module table")
        end = app.modules_table.step
        await wait_for(pilot, lambda: pace.shown_at is not None, "a step after it")
        assert pace.shown_at <= end + 2, (pace.shown_at, end)
        table = app.modules_table
        assert table.display and table.region.height > 3  # on screen, not only loaded
        assert "transformer.h" in table.text and "by activations" in str(table.border_title)
        assert "ledger:" in table.text
        # no line wider than the text's room beside a scrollbar: at 80 columns each row's
        # last cell wrapped onto a line of its own
        await pilot.pause()
        room = table.content_region.width - 3
        assert max(len(line) for line in table.text.splitlines()) <= room, room
        if size[0] < 100:
            assert app.view == "modules"
        await pilot.press("o")
        assert table.sort_key == "forward_peak_bytes" and "fwd peak▼" in table.text
        events = events_named(app.run_dir, R.MEMORY_ATTRIBUTION)
        assert events and events[0]["trigger"] == "request"  # the control event says who
        await pilot.press("a")  # a second window ...
        await wait_for(pilot, lambda: len(events_named(app.run_dir, R.ATTRIBUTION_STARTED))
                       == 2, "the second window")
        await pilot.press("a")  # ... cancelled by a again
        await wait_for(pilot, lambda: events_named(app.run_dir, R.ATTRIBUTION_CANCELLED)
                       or len(events_named(app.run_dir, R.MEMORY_ATTRIBUTION)) == 2,
                       "the second window ended")
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_code is not None, "the app to exit")


@pytest.mark.slow
async def test_a_in_the_viewer_goes_through_the_socket(headless_trainer):
    from tui.app import MemtopApp

    trainer = headless_trainer()
    app = MemtopApp.for_folder(trainer.run_dir, refresh_s=0.1, freeze_gc=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.run_state.step >= 3, "steps from the followed file")
        await pilot.press("a")
        await wait_for(pilot, lambda: app.modules_table.loaded, "the table from the socket")
        assert app.view == "modules" and "transformer.h" in app.modules_table.text
        control = events_named(trainer.run_dir, R.CONTROL)
        assert any(c["request"] == "attribute" and c["source"].startswith("viewer pid")
                   for c in control)
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_code is not None, "the viewer to exit")
    assert trainer.alive
