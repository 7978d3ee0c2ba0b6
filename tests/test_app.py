"""The dashboard, driven by Textual's Pilot over a real (tiny) CPU trainer thread.

Waits poll a condition with a generous deadline (the machine is shared); nothing asserts a time.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from conftest import run_cli, wait_for

from probes.hooks import StepHook
from probes.sample import Event
from tui.app import MemtopApp, stderr_to_file
from tui.widgets.help_screen import HelpScreen


def rows(app: MemtopApp) -> tuple[list[dict], list[dict]]:
    steps, events = [], []
    for line in (app.run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        (events if "event" in row else steps).append(row)
    return steps, events


async def test_panes_update_pause_resume_and_quit_joins_the_trainer(make_app):
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.ticks > 2 and app.last_sample is not None
                       and app.last_sample.step >= 3, "the first steps on screen")
        await wait_for(pilot, lambda: "n/a" not in app.panes["loss"].top_text, "loss pane")
        assert app.panes["allocated"].top_text.startswith("heap used")
        assert "MiB" in app.panes["allocated"].top_text  # glibc heap counter, real bytes
        assert app.panes["scale"].top_text.endswith("no scaler")  # bf16 on CPU
        first = app.panes["loss"].top_text
        await wait_for(pilot, lambda: app.panes["tokens"].history
                       and len(app.panes["tokens"].history) >= 5, "history")
        assert app.panes["tokens"].spark_points > 0
        assert "RUNNING" in app.header_bar.text and "B4 T16" in app.header_bar.text

        await pilot.press("space")
        await wait_for(pilot, lambda: app.trainer.status.state == "paused", "paused")
        await wait_for(pilot, lambda: "PAUSED" in app.header_bar.text, "PAUSED in header")
        frozen = app.trainer.status.step
        ticks = app.ticks
        await wait_for(pilot, lambda: app.ticks >= ticks + 5, "a few refreshes while paused")
        assert app.trainer.status.step == frozen
        assert f"step {frozen}" in app.header_bar.text

        await pilot.press("space")
        await wait_for(pilot, lambda: app.trainer.status.step > frozen + 2, "resumed steps")
        assert app.panes["loss"].top_text != first or app.panes["loss"].history

        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_code is not None, "the app to exit")
    assert app.return_code == 0
    assert not app.trainer.alive and app.finished
    steps, events = rows(app)
    assert len(steps) >= frozen + 2
    finished = [e for e in events if e["event"] == "run_finished"]
    assert finished and finished[-1]["reason"] == "stopped by user"
    assert (app.run_dir / "config.json").exists()


async def test_help_screen_opens_and_closes(make_app):
    app = make_app(autostart=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "help screen")
        text = " ".join(str(s.render()) for s in app.screen.query("Static"))
        for words in ("heap in use", "heap held", "RSS", "empty_cache", "nvidia-smi",
                      "sampled"):
            assert words in text, words
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen), "help closed")


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
        await pilot.pause(0.2)
        assert "parameters" in app.ledger.text and "3.0 MiB" in app.ledger.text

        app.ring.push(Event("error", 96, 6.0, {"error_type": "RuntimeError",
                                               "message": "CUDA out of memory", "traceback": ""}))
        await wait_for(pilot, lambda: app.error_banner.shown, "error banner")
        assert "CUDA out of memory" in app.error_banner.text


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


async def test_finished_run_stays_up_as_stopped_and_saves_a_screenshot(make_app):
    app = make_app(steps=6)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: "STOPPED" in app.header_bar.text, "STOPPED state")
        assert "step 6" in app.header_bar.text
        assert "finished" in app.status_line.text
        await wait_for(pilot, lambda: app.chart.builds > 0, "the memory chart")
        await pilot.press("s")
        await wait_for(pilot, lambda: list(app.run_dir.glob("screenshot-*.svg")), "screenshot")
        svg = next(app.run_dir.glob("screenshot-*.svg")).read_text()
        assert "<svg" in svg and "STOPPED" in svg
        assert app.return_code is None  # still up until q
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_code is not None, "the app to exit")
    assert app.return_code == 0


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


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_layout_fits_small_and_large_terminals(make_app, size):
    app = make_app(autostart=False)
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.2)
        width, height = size
        for widget in (app.header_bar, app.status_line, *app.panes.values()):
            region = widget.region
            assert region.width > 0 and region.height > 0, widget
            assert region.right <= width and region.bottom <= height, widget
        assert app.query_one("#chart-box").region.height >= 6
        assert app.header_bar.region.y == 0
        assert app.status_line.region.bottom == height - 1  # the footer below it
