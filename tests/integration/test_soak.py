"""A short soak: 500 tiny steps with every instrument, memtop's own memory stays flat (the
resilience of the dashboard and the counters: tests/unit/test_resilience.py)."""

from __future__ import annotations

from factories import in_thread

from probes.counters.memory import RssReader
from probes.monitor import default_hooks
from probes.runfolder import create_run_dir
from probes.tools.ring import Ring
from trainer.loop import Trainer


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
