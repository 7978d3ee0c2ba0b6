"""The instruments memtop attaches to its own training loop, from the run's config."""

from __future__ import annotations

from probes.instruments.hooks import StepHook
from probes.monitor.setup import default_hooks
from trainer.config import TrainConfig


def build_hooks(config: TrainConfig) -> list[StepHook]:
    """Profiler window (`p` and --profile-at), leak detector and memory ledger."""
    return default_hooks(
        profile_schedule=(config.profile_wait, config.profile_warmup, config.profile_active),
        profile_at=config.profile_at, profile_memory=config.profile_memory,
        profile_record_shapes=config.profile_record_shapes)
