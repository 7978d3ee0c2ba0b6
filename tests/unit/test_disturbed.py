"""One rule for the steps memtop's own diagnosis disturbs (probes/records/disturbed.py; issues 38
§2 and 44 §1-§2): a profiler window's traced steps, the steps while its table is computed, the
3 settling after, a culprit look's steps and the one after. Live (the row's ``disturbed``) and
read back from an older folder (rows without the field, no ``leak_look``) they are the same, and
timing, peaks, the leak detector, the report and compare all leave them out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from factories import RUN_CONFIG, RecordSink, make_sample

from probes import records as R
from probes.analysis.compare.compare import load_run
from probes.analysis.report.context import load_context
from probes.analysis.report.sections.infer_results import infer_results
from probes.analysis.report.sections.results import train_results
from probes.records import Event
from probes.records.disturbed import (
    AFTER_LOOK,
    ANALYSIS,
    LOOK,
    SETTLE,
    TRACED,
    DisturbedSteps,
    mark_disturbed,
)
from probes.runfolder import METRICS, RunRecorder, read_rows

MIB = 1024 * 1024
# the run below: a window traced 5-7, its table computed over 8-9 (profile_done at 9), 10-12
# settle; a look from the boundary after 20 to its second census at 23, 24 after it
EXPECTED = {**dict.fromkeys((5, 6, 7), TRACED), 8: ANALYSIS, 9: ANALYSIS,
            **dict.fromkeys((10, 11, 12), SETTLE), **dict.fromkeys((21, 22, 23), LOOK),
            24: AFTER_LOOK}


def _record(run_dir: Path, *, slow_ms: float = 90.0, big: int = 600 * MIB,
            infer: bool = False) -> Path:
    """A 30-step run written by the real recorder, each row built as the session builds it
    (its ``disturbed`` asked of the recorder's state, probes/monitor/session.py): the disturbed
    steps take ``slow_ms`` and hold ``big`` bytes (heap held, RSS), the others 5 ms and 100 MiB."""
    run_dir.mkdir(parents=True)
    config = dict(RUN_CONFIG, steps=30)
    if infer:
        config.update(mode="infer", prompt_len=8, new_tokens=30, requests=2, batch_size=2)
    rec = RunRecorder(run_dir, config=config)
    rec.emit(R.RUN_STARTED, 0, {"device": "cpu", "amp": "off", "params": 1000})

    def row(step: int, traced: bool = False) -> None:
        reason = rec.state.disturbed.reason(step, traced)
        hit = reason is not None
        extra = dict(phase=R.PREFILL if step == 1 else R.DECODE, tokens=2,
                     request=1 if step <= 2 else 2, context_tokens=8 + step) if infer else {}
        rec.publish(make_sample(step, time_s=step * 0.01, step_ms=slow_ms if hit else 5.0,
                                tokens_per_s=2 / (slow_ms if hit else 5.0) * 1000,
                                reserved_bytes=big if hit else 100 * MIB,
                                host_rss_bytes=big if hit else 100 * MIB,
                                driver_used_bytes=big if hit else 100 * MIB,
                                peak_allocated_bytes=50 * MIB, amp="off",
                                profiling=traced, disturbed=reason, **extra))

    for step in range(1, 31):
        if step == 5:
            rec.emit(R.PROFILE_STARTED, 4, {"wait": 1, "warmup": 1, "active": 1, "dir": "w"})
        row(step, traced=step in (5, 6, 7))
        if step == 7:
            rec.emit(R.PROFILE_ANALYSING, 7, {"dir": "w", "export_s": 0.01})
        elif step == 9:
            rec.emit(R.PROFILE_DONE, 9, {"dir": "w", "top_ops": []})
        elif step == 20:  # `w`, taken at the boundary before step 21
            rec.emit(R.CONTROL, 20, {"request": "who_holds", "source": "keyboard"})
            rec.emit(R.LEAK_LOOK, 20, {"trigger": "request"})
        elif step == 23:
            rec.emit(R.LEAK_CULPRIT, 23, {"trigger": "request", "first_step": 20, "steps": 3,
                                          "culprits": []})
    rec.emit(R.RUN_FINISHED, 30, {"reason": "finished"})
    rec.close()
    return run_dir


def _as_old_folder(run_dir: Path) -> Path:
    """The same run as memtop wrote it before the rule: no ``disturbed``, no ``leak_look``."""
    lines = (run_dir / METRICS).read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    rows = [{k: v for k, v in r.items() if k != "disturbed"} for r in rows
            if r.get("event") != R.LEAK_LOOK]
    (run_dir / METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


@pytest.fixture(params=["recorded", "old folder"])
def run(request, tmp_path):
    run_dir = _record(tmp_path / "run")
    return _as_old_folder(run_dir) if request.param == "old folder" else run_dir


def test_the_rule_names_each_disturbed_step_live_and_read_back(tmp_path):
    live = _record(tmp_path / "live")
    written = {r["step"]: r["disturbed"] for r in map(json.loads,
                                                      (live / METRICS).read_text().splitlines())
               if "event" not in r}
    assert {s: v for s, v in written.items() if v} == EXPECTED
    old = _as_old_folder(live)
    assert "disturbed" not in (old / METRICS).read_text()
    read = {r["step"]: r["disturbed"] for r in read_rows(old / METRICS).steps}
    assert read == written


def test_two_windows_analysed_at_once_each_hold_their_own_steps():
    # memtop infer: the prefill window's table is still computed while the decode window traces
    rule = DisturbedSteps()
    rule.event(R.PROFILE_STARTED, 10, {"dir": "pre"})
    rule.event(R.PROFILE_ANALYSING, 10, {"dir": "pre"})
    rule.event(R.PROFILE_STARTED, 12, {"dir": "dec"})
    rule.event(R.PROFILE_ANALYSING, 15, {"dir": "dec"})
    rule.event(R.PROFILE_DONE, 16, {"dir": "pre"})  # the first done: the second still runs
    assert rule.reason(17) == ANALYSIS
    rule.event(R.PROFILE_DONE, 18, {"dir": "dec"})
    assert [rule.reason(s) for s in (19, 21, 22)] == [SETTLE, SETTLE, None]
    # a window that never started (a cancel with nothing open) leaves no settle steps
    rule.event(R.PROFILE_CANCELLED, 30, {"reason": "the request has 1 decode steps left"})
    assert rule.reason(31) is None


def test_an_old_folder_marks_what_it_can_and_a_marked_row_is_kept():
    rows = [{"step": 1, "profiling": True}, {"step": 2}, {"step": 3, "disturbed": None}]
    rows[2]["profiling"] = True  # (a row that says it is not disturbed is not second-guessed)
    mark_disturbed(rows)
    assert [r["disturbed"] for r in rows] == [TRACED, None, None]


def test_report_and_compare_leave_the_disturbed_steps_out_of_timing_and_peaks(run):
    ctx = load_context(run)
    res = train_results(ctx.config, ctx.steps, ctx.started, ctx.finished)
    assert res["step_ms_p50"] == res["step_ms_p95"] == 5.0  # issue 44 §1: no 90 ms step
    assert res["peak_reserved_bytes"] == 100 * MIB  # §1: rank 1's heap held of a traced step
    assert res["host_rss_peak_bytes"] == res["driver_peak_bytes"] == 100 * MIB  # §2: RSS
    over = res["stats_over"]
    assert f"{len(EXPECTED)} disturbed" in over and "3 inside a culprit look" in over
    figures = load_run(run)
    assert max(figures.step_ms) == 5.0 and figures.peak_reserved_bytes == 100 * MIB
    assert figures.driver_peak_bytes == 100 * MIB


@pytest.mark.parametrize("old", [False, True])
def test_infer_decode_percentiles_leave_out_the_analysis_and_settle_steps(tmp_path, old):
    run_dir = _record(tmp_path / "infer", infer=True)
    if old:
        _as_old_folder(run_dir)
    res = infer_results(load_context(run_dir))
    assert res["decode_ms_p50"] == res["decode_ms_p95"] == 5.0  # issue 44 §1: not 90 ms
    assert res["decode_steps"] == 28 - len(EXPECTED)
    assert res["peak_reserved_bytes"] == 100 * MIB


def test_the_dashboard_step_time_range_leaves_them_out(tmp_path):
    from tui.panes import PANES

    run_dir = _record(tmp_path / "run")
    samples = [R.StepSample.from_json(r) for r in read_rows(run_dir / METRICS).steps]
    step_ms = next(p for p in PANES if p.id == "step_ms")
    shown = [step_ms.value(s) for s in samples if not step_ms.holds_last(s)]
    assert max(shown) == 5.0  # issue 44 §1: rank 0's step 55 was the dashboard's max


def test_live_figures_against_a_baseline_leave_them_out(tmp_path):
    from probes.analysis.baseline import LiveFigures

    live = LiveFigures(warmup_steps=0)
    for r in read_rows(_record(tmp_path / "run") / METRICS).steps:
        live.push(R.StepSample.from_json(r))
    assert live.figures()["step_ms"] == 5.0 and max(live.step_ms) == 5.0


def test_the_leak_watch_skips_a_disturbed_row(tmp_path):
    from factories import run_context

    from probes.instruments.hooks import StepTensors
    from probes.instruments.leakwatch import LeakWatch

    watch = LeakWatch()
    ctx = run_context(tmp_path)
    watch.setup(ctx)
    for step in range(1, 60):
        look = 30 <= step <= 34  # the look grows the heap 160 KiB a step, then gives it back
        heap = 100 * MIB + (160 * 1024 * (step - 29) if look else 0)
        watch.end_step(step, StepTensors(None, None),
                       make_sample(step, allocated_bytes=heap, host_rss_bytes=heap,
                                   disturbed=LOOK if look else None))
    assert watch.alerts == {} and watch.ignored_steps >= 5


# the real trainer: `w` pressed on a healthy run, and a leak that starts during a look ---------
GRAPH_SIZED = dict(layers=4, batch_size=16, seq_len=32, warmup_steps=5)


def _train(tiny_config, presses: list[int], **cfg):
    from probes.control import Request
    from probes.control.requests import RunControl
    from probes.monitor import default_hooks
    from probes.runfolder import create_run_dir
    from trainer.loop import Trainer

    config = tiny_config(**GRAPH_SIZED, **cfg)
    control = RunControl()
    for at in presses:  # `w`: what the dashboard's key and a viewer's socket request send
        control.submit(Request("who_holds", at_step=at))
    sink = RecordSink()
    trainer = Trainer(config, create_run_dir(config.run_dir), control=control, sinks=[sink],
                      hooks=default_hooks(**{**config.hook_options(), "profiler": False,
                                             "ledger": False}))
    trainer.start()
    assert trainer.join(300) and trainer.exit_code == 0
    return trainer, sink


@pytest.mark.slow  # four looks (0.3-0.8 s each) on a 4-layer model: ~10 s on two cores
def test_four_looks_on_a_healthy_run_raise_no_leak_alert(tiny_config):
    trainer, sink = _train(tiny_config, [20, 40, 60, 80], steps=100)
    looks = sink.named(R.LEAK_CULPRIT)
    assert [e.data["trigger"] for e in looks] == ["request"] * 4
    assert sink.named(R.LEAK_SUSPECTED) == []  # issue 38 §2: each look raised one
    marked = [s.step for s in sink.samples if s.disturbed in (LOOK, AFTER_LOOK)]
    assert len(marked) == sum(e.data["steps"] + 1 for e in looks)


@pytest.mark.slow
def test_a_leak_that_starts_during_a_look_is_alerted_soon_after_it(tiny_config):
    trainer, sink = _train(tiny_config, [30], steps=70, leak="graph", leak_at=31)
    look = next(e for e in sink.named(R.LEAK_CULPRIT) if e.data["trigger"] == "request")
    assert look.data["first_step"] < 31 <= look.step  # the leak began inside the look
    alerts = sink.named(R.LEAK_SUSPECTED)
    assert alerts and alerts[0].step <= look.step + 10


def test_leak_look_is_a_quiet_event_with_a_trigger():
    kind = R.EVENT_KINDS[R.LEAK_LOOK]
    assert not kind.loud and "trigger" in kind.fields
    event = Event(R.LEAK_LOOK, 3, 0.1, {"trigger": "request"})
    assert Event.from_json(event.to_json()).data == {"trigger": "request"}

