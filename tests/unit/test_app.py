"""The dashboard, driven by Textual's Pilot over a real (tiny) CPU trainer thread.

Waits poll a condition with a generous deadline (the machine is shared); nothing asserts a time.
"""

from __future__ import annotations

import io
import json
import os
import sys
import threading

import pytest
from factories import TOP_OPS, event_names, metrics_rows, wait_for
from textual.widgets import DataTable
from textual.widgets._footer import FooterKey

from probes import records as R
from probes.instruments.hooks import StepHook
from probes.records import EVENT_KINDS, Event
from tui.app import MemtopApp
from tui.dashboard_run import stderr_to_file
from tui.format import format_value
from tui.live_events import LIVE_EVENTS


@pytest.mark.slow
async def test_panes_update_pause_resume_and_quit_joins_the_trainer(make_app):
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.ticks > 2 and app.last_sample is not None
                       and app.last_sample.step >= 3, "the first steps on screen")
        await wait_for(pilot, lambda: "n/a" not in app.panes["loss"].top_text, "loss pane")
        assert app.panes["allocated"].top_text.startswith("heap used")
        assert "MiB" in app.panes["allocated"].top_text  # glibc heap counter, real bytes
        assert app.panes["scale"].top_text.endswith("no scaler")  # bf16 or fp32 on CPU
        await wait_for(pilot, lambda: app.panes["tokens"].history
                       and len(app.panes["tokens"].history) >= 5, "history")
        assert app.panes["tokens"].spark_points > 0
        assert "RUNNING" in app.header_bar.text and "B4 T16" in app.header_bar.text
        await pilot.press("m")  # a CPU run announces no memory_snapshot: said, not sent
        await wait_for(pilot, lambda: any("need a CUDA run" in n.message
                                          for n in app.notices), "the m notice")

        await pilot.press("space")
        await wait_for(pilot, lambda: app.trainer.status.state == "paused", "paused")
        await wait_for(pilot, lambda: "PAUSED" in app.header_bar.text, "PAUSED in header")
        frozen = app.trainer.status.step
        ticks = app.ticks
        await wait_for(pilot, lambda: app.ticks >= ticks + 5, "a few refreshes while paused")
        assert app.trainer.status.step == frozen
        assert f"step {frozen}" in app.header_bar.text

        paused_points = app.panes["loss"].taken  # not len(history): it may be full by now
        await pilot.press("space")
        await wait_for(pilot, lambda: app.trainer.status.step > frozen + 2, "resumed steps")
        await wait_for(pilot, lambda: app.last_sample.step > frozen + 2, "resumed steps drawn")
        assert app.panes["loss"].taken > paused_points  # the pane takes new steps again
        assert app.panes["loss"].top_text.endswith(format_value("loss", app.last_sample.loss))

        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_code is not None, "the app to exit")
    assert app.return_code == 0
    assert not app.trainer.alive and app.finished
    steps, events = metrics_rows(app.run_dir)
    assert len(steps) >= frozen + 2
    finished = [e for e in events if e["event"] == "run_finished"]
    assert finished and finished[-1]["reason"] == "stopped by user"
    assert (app.run_dir / "config.json").exists()


async def test_injected_events_render_banner_table_and_ledger(make_app):
    app = make_app(autostart=False)
    async with app.run_test(size=(80, 24)) as pilot:
        app.ring.push(Event("leak_suspected", 60, 3.0, {
            "counter": "host_heap", "bytes_per_step": 153600, "since_step": 41,
            "window_steps": 20, "capacity_bytes": 16 * 1024**3, "steps_to_full": 110000,
            "seconds_to_full": 5400.0, "hint": "log loss.item() or keep loss.detach()"}))
        await wait_for(pilot, lambda: app.leak_banner.shown, "leak banner")
        assert "150 KiB/step" in app.leak_banner.text and "since step 41" in app.leak_banner.text
        assert "loss.item()" in app.leak_banner.text
        assert app.panes["allocated"].has_class("-alert")
        assert not app.panes["reserved"].has_class("-alert")

        app.ring.push(Event("leak_cleared", 80, 4.0, {"counter": "host_heap",
                                                       "since_step": 41}))
        await wait_for(pilot, lambda: "CLEARED" in app.leak_banner.text, "leak cleared")
        assert not app.panes["allocated"].has_class("-alert")

        app.ring.push(Event("profile_done", 90, 5.0, {
            "dir": "profiles/step-85", "sort_by": "cpu", "top_ops": TOP_OPS, "analysis_s": 0.4,
            "steps": [87, 88, 89], "first_step": 85}))
        await wait_for(pilot, lambda: app.ops_table.ops, "top-ops table")
        table = app.ops_table.query_one(DataTable)
        assert table.row_count == 3
        # one window, one name: its traced steps above, its folder said as where it opened
        assert "top ops · steps 87–89 · by" in str(app.ops_table.border_title)
        assert "profiles/step-85 (opened at step 85)" in str(app.ops_table.border_subtitle)
        assert app.ops_table.row_names[0].endswith("Backward0")  # largest CPU total first
        assert app.view == "ops"  # 80 columns: the table replaces the chart
        await wait_for(pilot, lambda: "profiler: done, steps 87–89" in app.status_line.text,
                       "the status line says a window's table came (not \"off\")")
        assert not app.query_one("#chart-box").display
        await pilot.press("o")  # CPU total -> calls (wraps around)
        assert app.ops_table.sort_key == "calls"
        assert app.ops_table.row_names[0] == "aten::copy_"
        assert "calls ▼" in [str(c.label) for c in table.columns.values()]

        app.ring.push(Event("ledger", 95, 5.5, {
            "lines": [{"name": "parameters", "measured_bytes": 3 * 1024**2,
                       "predicted_bytes": 3 * 1024**2, "formula": "P × 4 B", "note": ""}],
            "total_measured_bytes": 3 * 1024**2, "allocated_bytes": 100 * 1024**2,
            "reserved_bytes": 120 * 1024**2, "sampled_step": 95}))
        await wait_for(pilot, lambda: app.ledger.data is not None, "ledger pane")
        await pilot.press("v")  # ops -> ledger
        assert app.view == "ledger"
        await wait_for(pilot, lambda: "parameters" in app.ledger.text, "the ledger's lines")
        assert "3.0 MiB" in app.ledger.text

        app.ring.push(Event("error", 96, 6.0, {"error_type": "RuntimeError",
                                               "message": "CUDA out of memory", "traceback": ""}))
        await wait_for(pilot, lambda: app.error_banner.shown, "error banner")
        assert "CUDA out of memory" in app.error_banner.text


async def test_a_loud_kind_without_a_handler_shows_its_summary_as_a_toast(make_app):
    """tui/live_events.py: a kind with no handler of its own gets the default, a toast of its
    summary (probes/records/events.py); a quiet kind and this dashboard's own requests none."""
    app = make_app(autostart=False)
    assert R.WEIGHTS_SAVED not in LIVE_EVENTS and EVENT_KINDS[R.WEIGHTS_SAVED].loud
    assert not EVENT_KINDS[R.REPORT_WRITTEN].loud
    saved = Event(R.WEIGHTS_SAVED, 7, 2.0, {"path": "weights.pt", "bytes": 3 * 1024**2})
    async with app.run_test(size=(80, 24)) as pilot:
        for quiet in (Event(R.REPORT_WRITTEN, 7, 2.0, {"path": "report.md"}),
                      Event(R.CONTROL, 7, 2.0, {"request": "profile", "source": "keyboard"})):
            app.ring.push(quiet)
        app.ring.push(Event(R.CONTROL, 7, 2.0, {"request": "pause", "source": "viewer pid 1"}))
        app.ring.push(saved)
        await wait_for(pilot, lambda: any(n.message == saved.summary()
                                          for n in app.notices), "the default toast")
        toasts = [(n.title, n.message) for n in app.notices]
        assert ("weights saved", "weights.pt (3.0 MiB)") in toasts
        assert ("control", "pause requested by viewer pid 1") in toasts  # another process
        assert len(toasts) == 2, toasts  # nothing for report_written nor our own key


class _FailAt(StepHook):
    """A real failure on the training thread at a given step."""

    def __init__(self, step: int) -> None:
        self.fail_step = step

    def end_step(self, step, tensors, sample) -> None:
        if step == self.fail_step:
            raise RuntimeError("boom from the training thread")


async def test_failed_training_keeps_the_dashboard_up_with_the_error(make_app):
    app = make_app(extra_hooks=[_FailAt(4)])
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.error_banner.shown, "error banner")
        assert "boom from the training thread" in app.error_banner.text
        await wait_for(pilot, lambda: "FAILED" in app.header_bar.text, "FAILED state")
        assert app.last_sample is not None and app.last_sample.step == 4
        assert "n/a" not in app.panes["loss"].top_text  # the last samples stay on screen
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_code is not None, "the app to exit")
    assert app.return_code == 1


class _HeldStep(StepHook):
    """A step that takes as long as the test wants (a long profiler analysis, a big model)."""

    def __init__(self, step: int) -> None:
        self.hold_step = step
        self.inside = threading.Event()
        self.release = threading.Event()

    def end_step(self, step, tensors, sample) -> None:
        if step == self.hold_step:
            self.inside.set()
            self.release.wait(120)


async def test_second_q_leaves_at_once_and_shutdown_says_what_it_waits_for(make_app):
    held = _HeldStep(3)
    app = make_app(extra_hooks=[held])
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, held.inside.is_set, "the held step")
        await pilot.press("q")
        await wait_for(pilot, lambda: "STOPPING" in app.header_bar.text, "STOPPING")
        await pilot.press("q")  # a second q: leave now, the step still runs
        await wait_for(pilot, lambda: app.return_code is not None, "the forced exit")
    assert app.trainer.alive and not app.finished

    out = io.StringIO()
    app.shutdown(timeout_s=0.2, out=out)  # bounded: gives up, says so, ends the run without it
    assert "waiting up to 0.2 s" in out.getvalue() and "still busy" in out.getvalue()
    assert app.trainer.alive and app.finished and app.ending.abandoned
    assert app.report_path == app.run_dir / "report.md" and app.report_path.is_file()
    metrics = app.run_dir / "metrics.jsonl"
    sealed = metrics.read_text()
    assert json.loads(sealed.splitlines()[-1])["event"] == "run_finished"

    held.release.set()  # the abandoned thread goes on: nothing it writes lands after that row
    assert app.trainer.join(60)
    assert metrics.read_text() == sealed


async def test_finished_run_stays_up_as_finished_and_saves_a_screenshot(make_app, tmp_path):
    app = make_app(steps=6)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: "FINISHED" in app.header_bar.text, "FINISHED state")
        assert "STOPPED" not in app.header_bar.text  # a run that ran its steps was not stopped
        assert "step 6" in app.header_bar.text
        assert "finished" in app.status_line.text
        await wait_for(pilot, lambda: "p" not in [k.key for k in app.screen.query(FooterKey)],
                       "the footer recomposed without p (an ended run has no profiler)")
        await wait_for(pilot, lambda: app.chart.builds > 0, "the memory chart")
        await pilot.press("s", "s")  # twice within a second: two files, not one overwritten
        await wait_for(pilot, lambda: len(list(app.run_dir.glob("screenshot-*.svg"))) == 2,
                       "two screenshots")
        svg = sorted(app.run_dir.glob("screenshot-*.svg"))[0].read_text()
        assert "<svg" in svg and "FINISHED" in svg

        blocked = tmp_path / "not-a-folder"  # saving into it fails with a real OSError
        blocked.write_text("")
        real_dir, app.run_dir = app.run_dir, blocked
        await pilot.press("s")
        await wait_for(pilot, lambda: any(n.severity == "error" for n in app.notices),
                       "the error notification")
        app.run_dir = real_dir
        error = next(n for n in app.notices if n.severity == "error")
        assert "screenshot not saved" in error.message
        assert app.return_code is None  # still up until q
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_code is not None, "the app to exit")
    assert app.return_code == 0


@pytest.mark.slow
async def test_profile_leak_and_report_keys_reach_the_real_trainer(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.trainer.status.step >= 3, "the first steps")
        await pilot.press("p")
        await wait_for(pilot, lambda: "profile_started" in event_names(app.run_dir),
                       "profile_started")
        await wait_for(pilot, lambda: "profiler: requested" not in app.status_line.text,
                       "the status line past 'requested'")
        await pilot.press("l")
        await wait_for(pilot, lambda: "leak_demo_started" in event_names(app.run_dir),
                       "the leak demo")
        await wait_for(pilot, lambda: "leak demo: graph since step" in app.status_line.text,
                       "the leak demo in the status line")
        assert app.trainer.status.leak_active
        await pilot.press("r")
        await wait_for(pilot, lambda: app.report_path is not None, "report.md")
        assert app.report_path == app.run_dir / "report.md" and app.report_path.is_file()
        report = json.loads((app.run_dir / "report.json").read_text())
        assert "leak_demo_started" in [e["event"] for e in report["leaks"]]
        assert app.return_code is None and app.trainer.alive  # `r` does not end the run
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_code is not None, "the app to exit")
    assert app.return_code == 0
    assert event_names(app.run_dir)[-1] == "run_finished"


def test_fd2_goes_to_the_log_while_the_ui_keeps_the_terminal(tmp_path, capfd):
    log = tmp_path / "stderr.log"
    before = sys.__stderr__
    with stderr_to_file(log) as term:
        assert sys.__stderr__ is term and sys.stderr is term
        os.write(2, b"[W CPUAllocator.cpp] chatter from C++\n")
        sys.__stderr__.write("drawn by the UI\n")
        sys.__stderr__.flush()
    assert sys.__stderr__ is before
    captured = capfd.readouterr().err
    assert "drawn by the UI" in captured and "chatter" not in captured
    text = log.read_text()
    assert "chatter from C++" in text and "drawn by the UI" not in text
    os.write(2, b"after\n")
    assert "after" in capfd.readouterr().err


async def test_deferred_trainer_builds_on_its_thread_and_trains(tiny_config, tmp_path):
    from probes.runfolder import create_run_dir

    app = MemtopApp.for_run(tiny_config(steps=0), create_run_dir(tmp_path / "runs"),
                            deferred=True, refresh_s=0.1, freeze_gc=False)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.last_sample is not None
                           and app.last_sample.step >= 3, "steps from the deferred trainer")
            assert app.trainer.real is not None and app.trainer.alive
            await pilot.press("q")
            await wait_for(pilot, lambda: app.return_code is not None, "the app to exit")
        assert app.return_code == 0
        assert event_names(app.run_dir)[-1] == "run_finished"
    finally:
        app.shutdown(timeout_s=60)
    assert not app.trainer.alive


async def test_ui_freezes_gc_keeps_its_thresholds_and_shutdown_unfreezes(tiny_config, tmp_path):
    import gc

    from probes.runfolder import create_run_dir

    before = gc.get_threshold()
    app = MemtopApp.for_run(tiny_config(steps=0), create_run_dir(tmp_path / "runs"),
                            deferred=True, refresh_s=0.1, freeze_gc=True)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.gc_frozen, "the freeze once the run started")
            assert gc.get_freeze_count() > 0
            assert gc.get_threshold() == before  # frequent gen-2 passes are the short ones
            await pilot.press("q")
            await wait_for(pilot, lambda: app.return_code is not None, "the app to exit")
    finally:
        app.shutdown(timeout_s=60)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


async def test_ctrl_c_in_the_dashboard_ends_the_run_as_sigint_does_headless(make_app):
    """Ctrl-C is a key in the dashboard's raw-mode terminal: it must give what SIGINT gives a
    headless run (README's exit table): run_finished 'interrupted (SIGINT)', exit 130 — `q`
    stays 'stopped by user', exit 0 (the test above)."""
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.last_sample is not None and app.last_sample.step >= 2,
                       "the first steps on screen")
        await pilot.press("ctrl+c")
        await wait_for(pilot, lambda: app.return_code is not None, "the app to exit")
    assert app.return_code == 130
    assert not app.trainer.alive and app.finished
    _, events = metrics_rows(app.run_dir)
    finished = [e for e in events if e["event"] == "run_finished"]
    assert finished and finished[-1]["reason"] == "interrupted (SIGINT)"


async def test_a_guard_stop_gives_the_banner_its_forecast_and_its_own_words(make_app):
    """After a guard stop the banner said "RSS fills the limit in 11 s" from a forecast of
    seconds before while the guard's said 2 steps / 3.4 s, and the error line said "would pass"
    of any stop (user pass): the guard's event is the newest forecast and its summary the
    words."""
    app = make_app(autostart=False)
    async with app.run_test(size=(80, 24)) as pilot:
        app.ring.push(Event("leak_suspected", 30, 3.0, {
            "counter": "host_heap", "bytes_per_step": 1024 * 1024, "since_step": 11,
            "window_steps": 16, "fill_counter": "host RSS", "limit_name": "--max-memory",
            "capacity_bytes": 40 * 1024**2, "fill_bytes_per_step": 4 * 1024**2,
            "steps_to_full": 10, "seconds_to_full": 11.0}))
        await wait_for(pilot, lambda: "11 s" in app.leak_banner.text, "the alert's forecast")
        app.ring.push(Event("memory_guard", 46, 5.0, {
            "counter": "host RSS", "watched_bytes": 607662080, "limit_bytes": 580 * 1024**2,
            "growth_bytes_per_step": 4 * 1024**2, "steps_to_full": 2, "seconds_to_full": 3.4}))
        await wait_for(pilot, lambda: app.error_banner.shown, "the guard's line")
        await wait_for(pilot, lambda: "3.40 s" in app.leak_banner.text, "the guard's forecast")
        assert "11 s" not in app.leak_banner.text
        assert "would pass 580 MiB (500 KiB left)" in app.error_banner.text
