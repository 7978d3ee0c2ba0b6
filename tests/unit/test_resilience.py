"""Degraded environments: terminal resizes mid-run, NVML missing (a long run's memory:
tests/integration/test_soak.py)."""

from __future__ import annotations

import sys

import pytest
from factories import wait_for

from probes.counters.nvml import NvmlPoller


def _inside(widget, width: int, height: int) -> bool:
    region = widget.region
    return region.right <= width and region.bottom <= height


@pytest.mark.slow
async def test_resizing_mid_run_keeps_training_and_layout(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.trainer.status.step >= 3, "first steps")
        widgets = (app.header_bar, app.status_line, *app.panes.values())
        for width, height in ((60, 20), (200, 60), (80, 24)):
            await pilot.resize_terminal(width, height)
            before = app.trainer.status.step
            await wait_for(pilot, lambda b=before: app.trainer.status.step >= b + 3,
                           f"steps after resizing to {width}x{height}")
            await wait_for(pilot, lambda w=width, h=height: app.size == (w, h) and all(
                _inside(x, w, h) for x in widgets), f"the layout at {width}x{height}")
        assert app.trainer.alive and app.trainer.status.state == "running"
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.trainer.alive, "the trainer to stop")


def test_nvml_missing_from_the_path_degrades_to_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` now raises ImportError
    poller = NvmlPoller(0)
    assert not poller.available and poller.read_once() is None
    assert "NVML unavailable" in poller.error
    poller.start()
    assert poller.latest is None
    poller.stop()
