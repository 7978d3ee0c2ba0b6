"""How optional instruments (profiler window, leak detector, memory ledger) plug into the loop.

A hook sees the run once at set-up, may wrap each step's compute in a context manager, and sees
each finished step. Hooks run on the training thread, so they may use torch freely.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from probes.memory import MemoryProbe
from probes.sample import Event, StepSample


@dataclass
class RunContext:
    """Everything a hook may need about the running training, built on the training thread."""

    config: Any  # the trainer's config (trainer.config.TrainConfig in memtop)
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    device: torch.device
    amp: str
    run_dir: Path
    memory: MemoryProbe
    emit: Callable[[Event], None]  # writes an event row and passes it on to the UI
    elapsed_s: Callable[[], float]
    set_profile_phase: Callable[[str | None], None]  # status line text, None when no window
    device_total_bytes: int | None  # device memory (CUDA) or host RAM (CPU)


@dataclass
class StepTensors:
    """The step's live tensors, handed to hooks before they go out of scope."""

    loss: torch.Tensor
    logits: torch.Tensor


class StepHook:
    """Base class with no-op methods; subclasses override what they need."""

    def setup(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def step_context(self, step: int) -> contextlib.AbstractContextManager[Any]:
        """Wraps forward + backward + optimizer of ``step``."""
        return contextlib.nullcontext()

    def end_step(self, step: int, tensors: StepTensors, sample: StepSample) -> None:
        """Called after the sample of ``step`` is taken."""

    def close(self) -> None:
        """The run is ending (normally or not): release resources, never raise."""
