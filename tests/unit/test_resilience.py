"""Degraded environments: terminal resizes mid-run, NVML missing, a long run's memory."""

from __future__ import annotations

import sys

from conftest import in_thread, wait_for

from probes.counters.memory import RssReader
from probes.counters.nvml import NvmlPoller
from probes.monitor import default_hooks
from probes.runfolder import create_run_dir
from probes.tools.ring import Ring
from trainer.loop import Trainer


def _inside(widget, width: int, height: int) -> bool:
    region = widget.region
    return region.right <= width and region.bottom <= height


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


def test_short_soak_keeps_memtops_memory_flat(tiny_config):
    """500 tiny steps with every instrument and a UI-like ring: RSS must not creep per step."""
    cfg = tiny_config(steps=500)
    ring: Ring = Ring(maxlen=512)
    rss_at: dict[int, int] = {}
    rss = RssReader()

    def watch(record) -> None:
        ring.push(record)
        if getattr(record, "step", 0) in (150, 500) and hasattr(record, "tokens_per_s"):
            rss_at[record.step] = rss.read()
        if len(ring) > 400:
            ring.drain()  # a UI that drains on its own clock

    trainer = Trainer(cfg, create_run_dir(cfg.run_dir), sinks=[watch],
                      hooks=default_hooks(**cfg.hook_options()))
    in_thread(trainer.run)
    assert trainer.exit_code == 0
    growth = rss_at[500] - rss_at[150]
    print(f"RSS growth over 350 steps: {growth / 1024:.0f} KiB")
    assert growth < 4 * 1024 * 1024, f"RSS grew {growth / 1024:.0f} KiB over 350 steps"
