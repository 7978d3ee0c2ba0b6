"""Time to full (probes/counters/fill.py): the counter that fills the limit, at its own rate,
recomputed as the rate changes, and the same figure in the leak banner and the memory guard."""

from __future__ import annotations

import random

import pytest
from factories import make_sample, run_context

from probes import records as R
from probes.counters.fill import FillTracker, fill_forecast, filling_counter
from probes.counters.memory import MemoryReading
from probes.instruments.hooks import StepTensors
from probes.instruments.leakwatch import LeakWatch
from probes.monitor.guard import MemoryGuard
from probes.records import Event
from tui.format_panels import GLIBC_KEEPS, leak_alert_line, leak_cleared_text

KIB, MIB, GIB = 1024, 1024**2, 1024**3


def test_one_formula_room_over_rate_times_sharers():
    fc = fill_forecast("host RSS", "--max-memory", 600 * MIB, 400 * MIB, 2 * MIB, 0.05)
    assert fc.steps_to_full == 200 and fc.seconds_to_full == pytest.approx(10.0)
    two = fill_forecast("host RSS", "host RAM available", 600 * MIB, 400 * MIB, 2 * MIB, 0.05,
                        sharers=2)  # two ranks on one host fill its RAM together
    assert two.steps_to_full == 100 and two.bytes_per_step == 4 * MIB
    flat = fill_forecast("host RSS", "--max-memory", 600 * MIB, 400 * MIB, 0.0, 0.05)
    assert flat.steps_to_full is None and flat.seconds_to_full is None


def test_the_counter_that_fills_the_limit():
    kw = dict(rss_bytes=1 * GIB, reserved_bytes=3 * GIB, driver_used_bytes=4 * GIB,
              device_total_bytes=80 * GIB, host_available=10 * GIB)
    assert filling_counter("cpu", 2 * GIB, **kw) == ("host RSS", "--max-memory", GIB, GIB)
    assert filling_counter("cpu", None, **kw) == ("host RSS", "host RAM available", GIB,
                                                  10 * GIB)
    assert filling_counter("cuda", 5 * GIB, **kw) == ("device reserved", "--max-memory",
                                                      3 * GIB, 2 * GIB)
    assert filling_counter("cuda", None, **kw) == ("device used (driver)", "device total",
                                                   4 * GIB, 76 * GIB)
    assert filling_counter("cpu", None, **dict(kw, host_available=None)) is None


def test_the_rate_is_refitted_as_it_changes():
    tracker = FillTracker(window_steps=8)
    where = ("host RSS", "--max-memory", 0, 1 * GIB)
    for step in range(1, 11):
        tracker.feed(step, 0.1 * step, 100 * MIB + step * MIB)
    assert tracker.forecast(where).steps_to_full == 1024
    for step in range(11, 21):  # the leak speeds up: the ETA follows within a window
        tracker.feed(step, 0.1 * step, 110 * MIB + (step - 10) * 4 * MIB)
    fc = tracker.forecast(where)
    assert fc.bytes_per_step == 4 * MIB and fc.steps_to_full == 256
    assert fc.seconds_to_full == pytest.approx(25.6)
    tracker.mark_gap()
    assert tracker.forecast(where) is None  # nothing comparable since the gap
    assert tracker.forecast(where, floor_bytes_per_step=MIB).steps_to_full == 1024


@pytest.mark.parametrize("fed", [600, 2600])
def test_steps_that_slow_as_the_leak_grows_are_summed_at_their_trend(fed):
    """Issue 30: a leak that slows its steps (55 → 145 ms in memtop's graph demo) fills later
    than the last steps' median says; the ETA sums the steps to come at the step time's trend,
    as far ahead as steps have been timed, the step time then held. Checked against the
    simulated truth: the time the series takes to reach the limit. After 2,600 steps (more
    than the ~2,400 left) the trend covers them all; after 600 (~4,400 left) the ETA is early,
    never late, and later than the last steps' median alone."""
    limit = 10 * GIB

    def step_s(step: int) -> float:  # 50 ms, +0.02 ms per step (the demo's was ~0.019)
        return 0.05 + 0.00002 * step

    tracker, t, rss = FillTracker(), 0.0, 300 * MIB
    for step in range(1, fed + 1):
        t += step_s(step)
        rss += 2 * MIB
        tracker.feed(step, t, rss)
    fc = tracker.forecast(("host RSS", "--max-memory", rss, limit - rss))
    truth, step, value = 0.0, fed, rss
    while value + 2 * MIB <= limit:
        step += 1
        value += 2 * MIB
        truth += step_s(step)
    flat = fill_forecast("host RSS", "--max-memory", rss, limit - rss, 2 * MIB,
                         tracker.seconds_per_step)
    assert fc.steps_to_full == step - fed
    assert flat.seconds_to_full < 0.85 * truth  # the median alone: full too early
    if fc.steps_to_full <= fed:
        assert fc.seconds_to_full == pytest.approx(truth, rel=0.03)
    else:
        assert flat.seconds_to_full * 1.1 < fc.seconds_to_full < truth


def _loaded_step_s(rng: random.Random, base_s: float) -> float:
    """A step on a loaded machine: most near base_s, some 2-20x slower (another process)."""
    slow = rng.random() < 0.15
    return base_s * rng.lognormvariate(0.0, 0.3) * (rng.uniform(2, 20) if slow else 1.0)


@pytest.mark.parametrize("seed", range(12))
def test_noise_on_a_loaded_machine_is_not_a_trend_that_adds_days(seed):
    """A new user's run: a tiny leak (64 KiB/step) against 22.8 GiB of host RAM, ~372k steps
    to go, 14 ms steps on a machine that other processes load. The trend read from that noise
    (the difference of two halves' medians) summed over 372k steps said 23 days for ~1.4 h."""
    rng, tracker, t, rss = random.Random(seed), FillTracker(), 0.0, 300 * MIB
    times = []
    for step in range(1, 601):
        dt = _loaded_step_s(rng, 0.014)
        times.append(dt)
        t += dt
        rss += 64 * KIB
        tracker.feed(step, t, rss)
    room = int(22.8 * GIB)
    fc = tracker.forecast(("host RSS", "host RAM available", rss, room))
    assert fc.steps_to_full == pytest.approx(room / (64 * KIB), rel=0.01)
    assert fc.seconds_to_full == pytest.approx(fc.steps_to_full * tracker.seconds_per_step,
                                               abs=0.1)  # to the tenth: no trend added


@pytest.mark.parametrize("seed", range(6))
def test_a_real_slowdown_on_a_quieter_machine_is_still_its_trend(seed):
    """The graph leak's slowdown (+0.02 ms a step on 50 ms) with a quieter machine's noise
    (±10%, one step in 20 two to five times slower): read at about its size, so its ETA still
    sums the slower steps to come. (Under the load above it may read flat: the ETA then errs
    early, ~30% at the demo's slowdown, never days late.)"""
    from probes.counters.fill import step_time_growth

    rng = random.Random(seed)

    def step_s(step: int) -> float:
        slow = rng.random() < 0.05
        return (0.05 + 0.00002 * step) * rng.lognormvariate(0.0, 0.1) * \
            (rng.uniform(2, 5) if slow else 1.0)

    points = [(s, step_s(s)) for s in range(1, 513)]
    assert step_time_growth(points) == pytest.approx(0.00002, rel=0.3)


def test_flat_steps_before_the_leak_are_not_its_rate():
    tracker = FillTracker()
    for step in range(1, 25):
        tracker.feed(step, 0.1 * step, 500 * MIB + max(0, step - 20) * 2 * MIB)
    where = ("host RSS", "--max-memory", 0, 100 * MIB)
    assert tracker.bytes_per_step() == 0  # 20 flat steps out of 24
    assert tracker.forecast(where, since_step=21).steps_to_full == 50


def test_the_banner_eta_does_not_flip_with_rss_chunks(tmp_path):
    """RSS grows in chunks (glibc hands the heap MiBs at a time): a 32-step fit read 6 -> 37 ->
    11 min within a minute on the graph demo (issue 38). The banner's forecast, recomputed
    every few seconds, follows the rate since the leak began, spread over up to 512 steps."""
    rng = random.Random(5)
    events: list[Event] = []
    watch = LeakWatch()
    watch.FORECAST_EVERY_S = 3.0
    watch.setup(run_context(tmp_path, emit=events.append, device_total_bytes=16 * GIB,
                            max_memory_bytes=8 * GIB))
    tensors = StepTensors(loss=None, output=None)
    rss, heap = 600 * MIB, 140 * MIB
    for step in range(1, 1200):  # 0.1 s a step: a forecast every 30 steps
        if step > 40:
            heap += 150 * KIB
            if rng.random() < 1 / 12:  # a chunk every ~12 steps: ~2.7 MiB a step on average
                rss += rng.choice((24, 32, 40)) * MIB
        sample = make_sample(step, time_s=0.1 * step, allocated_bytes=heap,
                             host_rss_bytes=rss + rng.randint(0, 64) * KIB)
        watch.end_step(step, tensors, sample)
    etas = [e.data["seconds_to_full"] for e in events
            if e.event == R.LEAK_FORECAST and e.step > 300 and e.data.get("seconds_to_full")]
    assert len(etas) > 20
    ratios = [max(a, b) / min(a, b) for a, b in zip(etas, etas[1:], strict=False)]
    assert max(ratios) < 1.3, ratios  # consecutive readings 3 s apart
    assert any(e.event == R.LEAK_SUSPECTED for e in events)


def rss_series(step: int) -> int:
    """RSS 2 MiB/step from step 11 while the heap grows 150 KiB/step: RSS fills the limit."""
    return 400 * MIB + max(0, step - 10) * 2 * MIB


def test_the_leak_banner_and_the_guard_give_the_same_time_to_full(tmp_path):
    limit = 700 * MIB
    events: list[Event] = []
    watch = LeakWatch()
    watch.FORECAST_EVERY_S = 0.0  # a forecast every step, to compare each one
    watch.setup(run_context(tmp_path, emit=events.append, device_total_bytes=16 * GIB,
                            max_memory_bytes=limit))
    watch.detectors = {"host_heap": watch.detectors.popitem()[1]}
    watch.detectors["host_heap"].counter = "host_heap"
    guard_events: list[tuple[str, int, dict]] = []
    guard = MemoryGuard(limit, "cpu", lambda *a: guard_events.append(a), lambda why: None)
    tensors = StepTensors(loss=None, output=None)
    compared = 0
    for step in range(1, 250):
        heap = 140 * MIB + max(0, step - 10) * 150 * KIB
        sample = make_sample(step, allocated_bytes=heap, host_rss_bytes=rss_series(step))
        watch.end_step(step, tensors, sample)
        reading = MemoryReading(heap, heap, heap, rss_series(step))
        if guard.check(step, reading, sample.time_s):
            break
        mine = [e for e in events if e.event == R.LEAK_FORECAST and e.step == step]
        if mine and step > 10 + 32:  # the guard's window is all leak (the banner fits from its
            # start, since_step, which the guard does not know)
            assert mine[-1].data["steps_to_full"] == guard.forecast.steps_to_full
            assert mine[-1].data["fill_counter"] == "host RSS"
            compared += 1
    assert compared > 40
    alert = next(e for e in events if e.event == R.LEAK_SUSPECTED)
    assert alert.data["fill_bytes_per_step"] == 2 * MIB  # RSS's rate, not the heap's
    (_, guard_step, data) = guard_events[-1]
    # the alert's forecast said when: the guard stopped where RSS would reach the limit
    assert abs(alert.step + alert.data["steps_to_full"] - guard_step) <= 1
    assert data["steps_to_full"] <= 1


def test_banner_text_names_what_fills_and_the_cleared_note():
    data = {"counter": "host_heap", "bytes_per_step": 150 * KIB, "since_step": 11,
            "fill_counter": "host RSS", "limit_name": "--max-memory",
            "capacity_bytes": 300 * MIB, "fill_bytes_per_step": 2 * MIB,
            "steps_to_full": 150, "seconds_to_full": 15.0}
    wide = leak_alert_line(data, 14)
    assert ("host RSS fills --max-memory (300 MiB left) at +2.0 MiB/step in ~150 steps / 15 s"
            in wide)
    assert len(leak_alert_line(data, 14, compact=True)) <= 78
    kept = leak_cleared_text({"counter": "host_heap", "host_rss_bytes": 1600 * MIB,
                              "alert_rss_bytes": 500 * MIB}, 60)
    assert "host RSS stays at 1.6 GiB" in kept and GLIBC_KEEPS in kept
    fell = leak_cleared_text({"counter": "host_heap", "host_rss_bytes": 300 * MIB,
                              "alert_rss_bytes": 900 * MIB}, 60)
    assert GLIBC_KEEPS not in fell


def test_a_guard_stop_in_one_rank_is_exit_status_3_for_the_launcher(tmp_path):
    from factories import write_run

    from probes.runfolder import json_line
    from trainer.exit_codes import EXIT_MEMORY_GUARD, EXIT_OK
    from tui.ranks_run import end_lines, ranks_exit_code

    run = write_run(tmp_path / "run", steps=5)
    for rank in (0, 1):
        (run / f"metrics-rank-{rank}.jsonl").write_text(
            (run / "metrics.jsonl").read_text(encoding="utf-8"), encoding="utf-8")
    (run / "metrics.jsonl").unlink()
    assert ranks_exit_code(run, 0) == EXIT_OK
    guard = Event(R.MEMORY_GUARD, 4, 0.5, {"counter": "host RSS", "watched_bytes": 10,
                                            "limit_bytes": 5, "growth_bytes_per_step": 1})
    with open(run / "metrics-rank-1.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json_line(guard.to_json()) + "\n")
    assert ranks_exit_code(run, 1) == EXIT_MEMORY_GUARD  # torchrun's own status says 1
    lines, _ = end_lines(run, 1)
    assert any("memory guard (--max-memory) stopped rank 1 at step 4" in ln for ln in lines)


def test_a_real_leak_forecast_agrees_with_when_the_guard_stops_it(tiny_config):
    """A real tiny run leaking its logits under --max-memory: the forecasts after the alert say
    when the guard will stop it, within 50% of the steps left at the median, each within 3×
    (a tiny run's RSS grows and shrinks in malloc's chunks, several steps' worth at once; the
    old forecast, host RAM / the heap's rate, was off by 100×), and the report says both."""
    from factories import RecordSink

    from probes.counters.host import RssReader
    from probes.runfolder import create_run_dir
    from trainer.loop import Trainer
    from tui.finish import finish_run

    # the same run without the leak first: its set-up and first steps' RSS (hundreds of MiB in
    # a fresh process, none in a worker that already trained) are not in the 200 MiB of room
    warm = Trainer(tiny_config(steps=3, batch_size=64, seq_len=32),
                   create_run_dir(tiny_config().run_dir))
    warm.start()
    assert warm.join(300) and warm.exit_code == 0
    limit = RssReader().read() + 200 * MIB  # room for the leak
    cfg = tiny_config(steps=600, batch_size=64, seq_len=32, leak="logits", leak_at=3,
                      max_memory_bytes=limit)
    watch = LeakWatch()
    watch.FORECAST_EVERY_S = 0.0
    sink = RecordSink()
    trainer = Trainer(cfg, create_run_dir(cfg.run_dir), sinks=[sink], hooks=[watch])
    trainer.start()
    assert trainer.join(300) and trainer.exit_code == 3
    (guard,) = sink.named(R.MEMORY_GUARD)
    forecasts = [e for e in sink.named(R.LEAK_FORECAST) if e.data.get("steps_to_full")]
    assert forecasts and all(e.data["fill_counter"] == "host RSS" for e in forecasts)
    errors = [abs(e.data["steps_to_full"] - (guard.step - e.step)) / (guard.step - e.step)
              for e in forecasts if guard.step - e.step >= 10]
    assert len(errors) >= 5 and max(errors) <= 2.0, errors
    assert sorted(errors)[len(errors) // 2] <= 0.5, errors
    finish_run(trainer.run_dir, None)
    md = (trainer.run_dir / "report.md").read_text(encoding="utf-8")
    assert "after the leak alert" in md and "Time to full, recomputed" in md


def test_one_name_per_counter_per_device_everywhere():
    """The pane at every width, the headless line and the ledger say the same name
    (probes/records/names.py); on CPU nothing says "allocator cache"."""
    from factories import make_sample

    from probes.records import CACHE_LINE, COUNTER_NAMES
    from tui.headless import format_step_line
    from tui.panes import pane_labels

    for dev in ("cpu", "cuda"):
        wide, narrow = pane_labels(dev), pane_labels(dev, short=True)
        for pane, names in COUNTER_NAMES.items():
            assert wide[pane] == narrow[pane] == names[dev] and len(names[dev]) <= 9
    line = format_step_line(make_sample(4))
    assert all(f"{names['cpu']} " in line for names in COUNTER_NAMES.values())
    assert "alloc " not in line and "resv" not in line
    assert CACHE_LINE["cpu"] != "allocator cache"


def test_the_paused_event_says_who_paused(tiny_config):
    """Headless printed "paused at step N by ?": the event now carries the request's source."""
    import threading

    from factories import RecordSink

    from probes.control.requests import Request, RunControl
    from probes.runfolder import create_run_dir
    from trainer.loop import Trainer

    control = RunControl()
    sink = RecordSink()
    paused = threading.Event()

    def on_record(record) -> None:
        if getattr(record, "event", None) == R.PAUSED:
            paused.set()
            control.resume()

    control.submit(Request("pause", at_step=3, source="viewer pid 42"))
    cfg = tiny_config(steps=5)
    trainer = Trainer(cfg, create_run_dir(cfg.run_dir), control=control,
                      sinks=[sink, on_record], listen=False)
    trainer.start()
    assert trainer.join(120) and paused.is_set()
    (event,) = sink.named(R.PAUSED)
    assert event.data["source"] == "viewer pid 42" and "by viewer pid 42" in event.summary()


def test_the_guard_says_passed_once_over_the_limit_with_the_fitted_rate():
    """"host RSS at 502 MiB (+9.9 MiB/step) would pass --max-memory 500 MiB next step (0 B
    left)" was said of a counter already over the limit, with one chunk as its rate where the
    leak alert said 2.0 MiB/step (issue 44)."""
    from probes.monitor.guard import guard_reason

    limit = 500 * MIB
    why = guard_reason(80, "host RSS", 502 * MIB, limit, int(9.9 * MIB), 2 * MIB)
    assert why == ("memory guard: host RSS at 502 MiB passed --max-memory 500 MiB this step "
                   "(2.0 MiB over; +2.0 MiB/step fitted, +9.9 MiB this step)")
    ahead = guard_reason(80, "host RSS", 497 * MIB, limit, 4 * MIB, 4 * MIB)
    assert ahead == ("memory guard: host RSS at 497 MiB (+4.0 MiB/step fitted) would pass "
                     "--max-memory 500 MiB next step (3.0 MiB left)")
    assert "+4.0 MiB/step)" in guard_reason(80, "host RSS", 497 * MIB, limit, 4 * MIB, None)
    over = guard_reason(3, "host RSS", 550 * MIB, limit, 0, None)  # over before this step
    assert over == "memory guard: host RSS at 550 MiB is over --max-memory 500 MiB (50.0 MiB over)"
    summary = R.EVENT_KINDS[R.MEMORY_GUARD].summary
    assert "passed" in summary({"counter": "host RSS", "watched_bytes": 502 * MIB,
                                "limit_bytes": limit})
    assert "would pass" in summary({"counter": "host RSS", "watched_bytes": 497 * MIB,
                                    "limit_bytes": limit})

    rows: list = []
    guard = MemoryGuard(limit, "cpu", lambda *a: rows.append(a), lambda why: rows.append(why))
    for step in range(1, 40):  # 2 MiB a step, then one 9.9 MiB chunk past the limit
        rss = 420 * MIB + step * 2 * MIB + (int(9.9 * MIB) if step == 39 else 0)
        stopped = guard.check(step, MemoryReading(rss, rss, rss, rss), 0.1 * step)
        if stopped:
            break
    (_, step, data), why = rows
    assert step == 39 and data["passed"] is True and data["watched_bytes"] > limit
    assert data["fill_bytes_per_step"] == 2 * MIB and "passed --max-memory" in why
