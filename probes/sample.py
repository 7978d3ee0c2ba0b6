"""Records that cross threads: frozen, flat, units in the field names."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StepSample:
    """What one training step measured. None means "this probe could not read" (shown as n/a)."""

    step: int  # 1-based index of the optimizer step just finished
    time_s: float  # seconds since the run started, at the end of the step
    loss: float
    tokens_per_s: float  # B*T / step wall time
    step_ms: float  # wall time of the whole step, data to optimizer update
    allocated_bytes: int | None  # CUDA: memory_allocated; CPU: glibc heap in use
    reserved_bytes: int | None  # CUDA: memory_reserved; CPU: bytes malloc holds from the OS
    peak_allocated_bytes: int | None  # since the reset after warmup (CPU: max of sampled values)
    driver_used_bytes: int | None  # CUDA: NVML, this process on the device; CPU: process RSS
    host_rss_bytes: int | None  # resident set size of this process
    scale: float | None  # GradScaler scale; None when no scaler runs
    skipped_steps: int  # optimizer steps skipped so far (inf/nan gradients)
    amp: str  # "off" | "bf16" | "fp16"
    device: str  # "cpu" | "cuda:0" ...
    grad_norm: float | None = None  # total gradient norm before clipping (unscaled)
    profiling: bool = False  # this step ran inside a profiler window
    leak_active: bool = False  # a leak demo was injecting during this step

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


STEP_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(StepSample))


@dataclass(frozen=True)
class Event:
    """Something that happened once: run_started, leak_suspected, profile_done, error, ..."""

    event: str
    step: int
    time_s: float
    data: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"event": self.event, "step": self.step, "time_s": self.time_s}
        row.update(self.data)
        return row
