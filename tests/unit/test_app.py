"""The dashboard, driven by Textual's Pilot over a real (tiny) CPU trainer thread.

Waits poll a condition with a generous deadline (the machine is shared); nothing asserts a time.
"""

from __future__ import annotations

import inspect
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import ROOT, TINY, run_cli, wait_for

from probes import records as R
from probes.counters.nvml import NvmlPoller
from probes.instruments.hooks import StepHook
from probes.records import EVENT_KINDS, Event
from tui.app import MemtopApp
from tui.dashboard_run import stderr_to_file
from tui.format import format_value
from tui.live_events import LIVE_EVENTS
from tui.panes import PANES
from tui.widgets.footer import MemtopFooter
from tui.widgets.help_screen import HelpScreen, counter_paragraphs
from tui.widgets.memory_chart import REF_CELLS

CUDA_COUNTERS = counter_paragraphs("cuda")  # the help's counter section on CUDA


def rows(app: MemtopApp) -> tuple[list[dict], list[dict]]:
    steps, events = [], []
    for line in (app.run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        (events if "event" in row else steps).append(row)
    return steps, events


def event_names(app: MemtopApp) -> list[str]:
    """Events in metrics.jsonl so far; a line the trainer is still writing is skipped."""
    names = []
    for line in (app.run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if "event" in row:
            names.append(row["event"])
    return names


async def test_panes_update_pause_resume_and_quit_joins_the_trainer(make_app):
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.ticks > 2 and app.last_sample is not None
                       and app.last_sample.step >= 3, "the first steps on screen")
        await wait_for(pilot, lambda: "n/a" not in app.panes["loss"].top_text, "loss pane")
        assert app.panes["allocated"].top_text.startswith("heap used")
        assert "MiB" in app.panes["allocated"].top_text  # glibc heap counter, real bytes
        assert app.panes["scale"].top_text.endswith("no scaler")  # bf16 on CPU
        await wait_for(pilot, lambda: app.panes["tokens"].history
                       and len(app.panes["tokens"].history) >= 5, "history")
        assert app.panes["tokens"].spark_points > 0
        assert "RUNNING" in app.header_bar.text and "B4 T16" in app.header_bar.text
        await pilot.press("m")  # a CPU run announces no memory_snapshot: said, not sent
        await wait_for(pilot, lambda: any("need a CUDA run" in n.message
                                          for n in app._notifications), "the m notice")

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
    steps, events = rows(app)
    assert len(steps) >= frozen + 2
    finished = [e for e in events if e["event"] == "run_finished"]
    assert finished and finished[-1]["reason"] == "stopped by user"
    assert (app.run_dir / "config.json").exists()


def test_help_states_the_nvml_poll_rate_the_poller_uses():
    interval = inspect.signature(NvmlPoller).parameters["interval_s"].default
    assert f"every {interval:g} s" in " ".join(CUDA_COUNTERS)


async def test_help_screen_opens_and_closes(make_app):
    app = make_app(autostart=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "help screen")
        text = " ".join(str(s.render()) for s in app.screen.query("Static"))
        for words in ("heap in use", "heap held", "RSS", "empty_cache", "nvidia-smi",
                      "sampled"):
            assert words in text, words
        from probes.records import HINTS

        for hint in HINTS:  # every live hint is listed, the CUDA-only ones marked on CPU
            assert hint.title in text, hint.name
        assert "(CUDA only)" in text
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen), "help closed")


async def test_help_is_built_once_and_screen_changes_leave_nothing_behind(make_app):
    """Re-opening help re-pushes the same screen; the Footer keeps no watchers of removed keys
    (Textual #6666 kept ~9 FooterKeys per screen change: RSS slope, gen-2 gc pauses)."""
    app = make_app(autostart=False)
    async with app.run_test(size=(80, 24)) as pilot:
        footer = app.query_one(MemtopFooter)
        screens, watchers = [], []
        for _ in range(4):
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "help screen")
            screens.append(app.screen)
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen), "closed")
            await pilot.pause()
            watchers.append(footer.compact_watchers())
        assert all(s is screens[0] for s in screens)
        assert watchers[-1] <= watchers[0], watchers  # unpatched Footer: +9 per open/close
        assert watchers[0] <= len(footer.query("FooterKey"))


OPS = [
    {"name": "aten::mm", "calls": 105, "self_cpu_us": 31000.0, "cpu_total_us": 31400.0,
     "self_device_us": None, "device_total_us": None, "cpu_memory_bytes": None,
     "device_memory_bytes": None},
    {"name": "aten::copy_", "calls": 1272, "self_cpu_us": 24000.0, "cpu_total_us": 24000.0,
     "self_device_us": None, "device_total_us": None, "cpu_memory_bytes": None,
     "device_memory_bytes": None},
    {"name": "autograd::engine::evaluate_function: ScaledDotProductAttentionBackward0",
     "calls": 12, "self_cpu_us": 900.0, "cpu_total_us": 45000.0, "self_device_us": None,
     "device_total_us": None, "cpu_memory_bytes": None, "device_memory_bytes": None},
]


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
            "dir": "profiles/step-85", "sort_by": "cpu", "top_ops": OPS, "analysis_s": 0.4}))
        await wait_for(pilot, lambda: app.ops_table.ops, "top-ops table")
        table = app.ops_table._table
        assert table.row_count == 3
        assert app.ops_table.row_names[0].endswith("Backward0")  # largest CPU total first
        assert app.view == "ops"  # 80 columns: the table replaces the chart
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
                                          for n in app._notifications), "the default toast")
        toasts = [(n.title, n.message) for n in app._notifications]
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


async def test_finished_run_stays_up_as_stopped_and_saves_a_screenshot(make_app, tmp_path):
    app = make_app(steps=6)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: "STOPPED" in app.header_bar.text, "STOPPED state")
        assert "step 6" in app.header_bar.text
        assert "finished" in app.status_line.text
        await wait_for(pilot, lambda: app.chart.builds > 0, "the memory chart")
        await pilot.press("s", "s")  # twice within a second: two files, not one overwritten
        await wait_for(pilot, lambda: len(list(app.run_dir.glob("screenshot-*.svg"))) == 2,
                       "two screenshots")
        svg = sorted(app.run_dir.glob("screenshot-*.svg"))[0].read_text()
        assert "<svg" in svg and "STOPPED" in svg

        blocked = tmp_path / "not-a-folder"  # saving into it fails with a real OSError
        blocked.write_text("")
        real_dir, app.run_dir = app.run_dir, blocked
        await pilot.press("s")
        await wait_for(pilot, lambda: any(n.severity == "error" for n in app._notifications),
                       "the error notification")
        app.run_dir = real_dir
        error = next(n for n in app._notifications if n.severity == "error")
        assert "screenshot not saved" in error.message
        assert app.return_code is None  # still up until q
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_code is not None, "the app to exit")
    assert app.return_code == 0


async def test_profile_leak_and_report_keys_reach_the_real_trainer(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.trainer.status.step >= 3, "the first steps")
        await pilot.press("p")
        await wait_for(pilot, lambda: "profile_started" in event_names(app), "profile_started")
        await wait_for(pilot, lambda: "profiler: requested" not in app.status_line.text,
                       "the status line past 'requested'")
        await pilot.press("l")
        await wait_for(pilot, lambda: "leak_demo_started" in event_names(app), "the leak demo")
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
    assert event_names(app)[-1] == "run_finished"


def _tiny_train_args(run_root) -> list[str]:
    args = ["train", "--device", "cpu", "--steps", "0", "--run-dir", str(run_root)]
    for key in ("layers", "heads", "dim", "seq_len", "block_size", "batch_size", "warmup_steps"):
        args += [f"--{key.replace('_', '-')}", str(TINY[key])]
    return args


# (SIGHUP with the terminal really gone, in every state: tests/test_terminal_loss.py)
@pytest.mark.parametrize("sig", [signal.SIGTERM])
def test_signal_quits_cleanly_and_gives_the_terminal_back(tmp_path, sig):
    """The real dashboard on a pseudo-terminal, killed: run_finished, report, cooked terminal."""
    import fcntl
    import select
    import struct
    import termios

    try:
        master, slave = os.openpty()
    except OSError as exc:
        pytest.skip(f"no pseudo-terminal here: {exc}")
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    cooked = termios.tcgetattr(slave)[3] & (termios.ICANON | termios.ECHO | termios.ISIG)
    root = tmp_path / "runs"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TERM="xterm-256color")
    proc = subprocess.Popen([sys.executable, "-m", "tui.cli", *_tiny_train_args(root)],
                            cwd=ROOT, env=env, stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True)
    shown = bytearray()

    def drain(timeout: float) -> None:  # read what the app draws so the pty never fills up
        if select.select([master], [], [], timeout)[0]:
            try:
                shown.extend(os.read(master, 1 << 16))
            except OSError:
                pass

    def steps_written() -> int:
        found = list(root.glob("*/metrics.jsonl"))
        return found[0].read_text().count('"loss"') if found else 0

    try:
        deadline = time.monotonic() + 90
        while steps_written() < 3 and proc.poll() is None and time.monotonic() < deadline:
            drain(0.1)
        assert proc.poll() is None and steps_written() >= 3, bytes(shown[-2000:])
        raw = termios.tcgetattr(slave)[3] & (termios.ICANON | termios.ECHO | termios.ISIG)
        assert raw != cooked  # the app really had the terminal in raw mode
        proc.send_signal(sig)
        deadline = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline:
            drain(0.1)
        drain(0.2)
        assert proc.poll() == 128 + sig, bytes(shown[-2000:])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        after = termios.tcgetattr(slave)[3] & (termios.ICANON | termios.ECHO | termios.ISIG)
        os.close(master)
        os.close(slave)
    run_dir = next(root.iterdir())
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["event"] == "run_finished"
    assert last["reason"] == f"interrupted ({signal.Signals(sig).name})"
    assert (run_dir / "report.md").is_file()
    assert after == cooked  # echo and line editing are back
    assert f"memtop: run folder {run_dir}".encode() in shown


def test_no_terminal_says_so_and_exits_2(tmp_path):
    result = run_cli("train", "--run-dir", str(tmp_path / "runs"), timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--headless" in lines[0] and "TTY" in lines[0]
    assert not (tmp_path / "runs").exists()


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


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)])
async def test_layout_fits_small_and_large_terminals(make_app, size):
    app = make_app(autostart=False)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.status_line.region.height > 0, "the first layout")
        width, height = size
        for widget in (app.header_bar, app.status_line, *app.panes.values()):
            region = widget.region
            assert region.width > 0 and region.height > 0, widget
            assert region.right <= width and region.bottom <= height, widget
        assert app.query_one("#chart-box").region.height >= 6
        assert app.header_bar.region.y == 0
        assert app.status_line.region.bottom == height - 1  # the footer below it
        # What grows with the screen is bounded: chart rebuilds per second fall as its canvas
        # grows past 120x40's, Sparklines hold no more points than they are wide.
        chart = app.chart
        cells = chart.size.width * chart.size.height
        assert chart.interval_s() * min(cells, REF_CELLS) == pytest.approx(
            chart.every_s * cells)
        for pane in app.panes.values():
            pane.push([1.0] * 500)
            pane.refresh_view()
            assert len(pane.points) <= max(1, pane.size.width)
            # what the pane draws (tui/widgets/line_pane.py) is its text and a full bar row
            assert pane.render_line(0).text.rstrip() == pane.top_text.rstrip()
            assert pane.render_line(1).text.rstrip() == pane.range_line.rstrip()
            bars = pane.render_line(2)
            assert bars.cell_length == pane.size.width and set(bars.text) == {"▁"}


DEFERRED_FRAME = r"""
import asyncio, sys
from pathlib import Path
from probes.runfolder import create_run_dir
from trainer.config import TrainConfig
from tui.app import MemtopApp

async def main():
    config = TrainConfig(device="cpu", steps=0, run_dir=sys.argv[1])
    app = MemtopApp.for_run(config, create_run_dir(sys.argv[1]), deferred=True, autostart=False,
                            freeze_gc=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        print("header:", app.header_bar.text.replace("\n", " "))
        print("panes:", len(app.panes), "torch imported:", "torch" in sys.modules)
    app.shutdown(10)

asyncio.run(main())
"""


def test_deferred_dashboard_frame_is_up_before_torch_is_imported(tmp_path):
    """`memtop train` draws header and panes, "starting", while torch is not yet imported:
    the trainer thread imports it (benchmarks/RESULTS.md: the frame within 0.6 s, RESULTS.md)."""
    res = subprocess.run([sys.executable, "-c", DEFERRED_FRAME, str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr[-2000:]
    assert "STARTING" in res.stdout and "torch imported: False" in res.stdout, res.stdout
    assert f"panes: {len(PANES)} " in res.stdout, res.stdout  # every pane of the table


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
        assert event_names(app)[-1] == "run_finished"
    finally:
        app.shutdown(timeout_s=60)
    assert not app.trainer.alive


async def test_chart_rebuilds_off_the_event_loop_and_at_once_for_a_screenshot(make_app):
    from types import SimpleNamespace

    app = make_app(autostart=False)
    async with app.run_test(size=(120, 40)) as pilot:
        chart = app.chart
        await wait_for(pilot, lambda: chart.builds >= 1, "the first (empty) figure")
        first = chart.render()
        builders: list[str] = []
        original = chart._build_text

        def recording(*args):
            builders.append(threading.current_thread().name)
            return original(*args)

        chart._build_text = recording
        chart.add_points([SimpleNamespace(step=i, allocated_bytes=2**20 * i,
                                          reserved_bytes=2**21 * i) for i in range(1, 50)])
        assert chart.maybe_redraw(None)
        assert chart.render() is first  # the old figure stays up while the thread builds
        await wait_for(pilot, lambda: chart.builds >= 2, "the figure built on a thread")
        assert builders and set(builders) == {"memtop-chart"}  # once per size the layout had
        assert chart.render() is not first and "step" in chart.render().plain
        chart.add_points([SimpleNamespace(step=60, allocated_bytes=1, reserved_bytes=2)])
        builds = chart.builds
        assert chart.maybe_redraw(None, force=True)
        chart.render()
        assert chart.builds == builds + 1 and builders[-1] == threading.current_thread().name


async def test_ui_freezes_gc_spaces_gen2_passes_and_shutdown_restores_both(tiny_config, tmp_path):
    import gc

    from probes.runfolder import create_run_dir
    from tui.app import GEN2_EVERY

    before = gc.get_threshold()
    app = MemtopApp.for_run(tiny_config(steps=0), create_run_dir(tmp_path / "runs"),
                            deferred=True, refresh_s=0.1, freeze_gc=True)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app._gc_frozen, "the freeze once the run started")
            assert gc.get_freeze_count() > 0
            assert gc.get_threshold() == (*before[:2], max(before[2], GEN2_EVERY))
            await pilot.press("q")
            await wait_for(pilot, lambda: app.return_code is not None, "the app to exit")
    finally:
        app.shutdown(timeout_s=60)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
