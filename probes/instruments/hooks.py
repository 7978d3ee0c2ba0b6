"""How instruments (profiler window, leak detector, memory ledger) plug into a monitored loop.

A hook sees the run once at set-up, may wrap each step's compute in a context manager, and sees
each finished step. Hooks run on the training thread, so they may use torch freely.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from probes.counters.memory import MemoryProbe
from probes.counters.workers import ProcessTreeSampler, WorkersReading
from probes.records import Event, StepSample


@dataclass(frozen=True)
class GPTShape:
    """The sizes of a GPT of memtop's own kind (trainer/model.py). The ledger's formula-based
    predictions need them; for any other model the ledger says "measured only"."""

    layers: int
    heads: int
    dim: int
    attention: str  # "explicit" | "sdpa"
    block_size: int
    vocab_size: int


@dataclass
class RunContext:
    """Everything a hook may need about the running loop, built on the training thread."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    device: torch.device
    amp: str  # "off" | "bf16" | "fp16" | "auto" (not known yet: seen in the first forward)
    run_dir: Path
    memory: MemoryProbe
    emit: Callable[[Event], None]  # writes an event row and passes it on
    elapsed_s: Callable[[], float]
    device_total_bytes: int | None  # device memory (CUDA) or host RAM (CPU)
    warmup_steps: int = 0  # steps before the peak reset: instruments ignore them
    max_steps: int = 0  # the planned last step; 0 = until stopped
    model_shape: GPTShape | None = None
    config: Mapping[str, Any] = field(default_factory=dict)  # config.json's content
    rank: int | None = None  # under torchrun: this process's rank
    max_memory_bytes: int | None = None  # --max-memory: the limit the guard stops before
    urgent: Callable[[], bool] = lambda: False  # the run is ending in a hurry (close(): no waits)
    offer: Callable[[str, Callable[[int], object]], None] | None = None  # act on a request kind
    memory_history: str = "off"  # CUDA allocation history as run_started says ("off" or on)
    # the training process's children, read on their own thread (probes/counters/workers.py):
    # ``workers.latest`` is their latest reading; None when not sampled
    workers: ProcessTreeSampler | None = None


@dataclass(slots=True)
class StepTensors:
    """The step's live tensors, handed to hooks before they go out of scope."""

    loss: torch.Tensor | None
    output: torch.Tensor | None  # the model's output (logits for a language model), if given
    synced: bool = True  # the end-of-step read waited for the device (a CUDA tensor was read)
    output_bytes: int | None = None  # the output's size, kept when the tensors are not
    heap_fresh: bool = True  # CPU: the row's heap counters were read this step (memory.py)
    host_heap_bytes: int | None = None  # CUDA: the host heap read at this step's end (its
    # budgeted rate: probes/counters/memory.py); None on the steps between
    # the workers' reading the row carries, when it is new since the last row (else None):
    # the leak watch feeds the workers' series one point per reading, never a repeated value
    workers: WorkersReading | None = None


class StepHook:
    """Base class with no-op methods; subclasses override what they need.

    ``batched = True`` says the hook's ``end_step`` may run late: up to
    probes/runfolder/recorder.py's DRAIN_EVERY_S after its step, on the training thread, with
    the rows of a few steps in one batch (cheaper per step, issue 28), always before the next
    event row, ``between_steps`` and ``close``; its ``tensors`` then carry no tensors, only
    ``synced`` and ``output_bytes``. A hook that drives the step itself (the profiler's
    schedule) or reads live tensors keeps the default, False: called at its step's end.
    """

    batched = False

    def setup(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def step_context(self, step: int) -> contextlib.AbstractContextManager[Any]:
        """Wraps forward + backward + optimizer of ``step``."""
        return contextlib.nullcontext()

    def end_step(self, step: int, tensors: StepTensors, sample: StepSample) -> None:
        """Called after the sample of ``step`` is taken."""

    def between_steps(self, kind: str) -> None:
        """The loop ran something between two steps (``kind``: an evaluation, a checkpoint
        save): what it allocated or freed is not a step's doing."""

    def close(self) -> None:
        """The run is ending (normally or not): release resources, never raise."""


def overriding(hooks: list[StepHook], method: str) -> list[StepHook]:
    """The hooks whose class overrides ``method`` of StepHook: the step path calls only those
    (a no-op call per hook and step was ~0.5 µs each: issue 28)."""
    base = getattr(StepHook, method)
    return [h for h in hooks if getattr(type(h), method, base) is not base]
