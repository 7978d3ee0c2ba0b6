"""The instruments memtop attaches to its training loop, built from the run's config."""

from __future__ import annotations

from probes.hooks import StepHook
from probes.leak import LeakWatch
from probes.ledger import Ledger
from probes.profwindow import ProfilerWindow
from trainer.config import TrainConfig


def build_hooks(config: TrainConfig) -> list[StepHook]:
    """Profiler window, leak detector and memory ledger, in the order they see each step."""
    hooks: list[StepHook] = []
    hooks.append(ProfilerWindow.from_config(config))  # `p` and --profile-at windows
    hooks.append(LeakWatch())  # leak_suspected / leak_cleared events
    hooks.append(Ledger())  # last: sees each step after the others
    return hooks
