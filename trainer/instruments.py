"""The instruments memtop attaches to its training loop, built from the run's config."""

from __future__ import annotations

from probes.hooks import StepHook
from trainer.config import TrainConfig


def build_hooks(config: TrainConfig) -> list[StepHook]:
    """Profiler window, leak detector and memory ledger, in the order they see each step."""
    hooks: list[StepHook] = []
    return hooks
