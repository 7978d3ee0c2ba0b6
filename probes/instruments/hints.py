"""The tutorial's pitfalls (its §7) seen live: each hint is defined once in probes/records/hints.py
(HINTS), checked here on the training thread from what a step already measured, and written once
a run as a ``hint`` event (headless prints it, the dashboard notifies, the help screen lists all).
Nothing here reads the device: every check uses the step's sample or the model's dtypes.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from typing import Any

import torch

from probes import records as R
from probes.counters.cuda_stats import fragmentation
from probes.counters.host import bf16_emulated_why, cpu_bf16_override, read_cpu_flags
from probes.instruments.hooks import RunContext, StepHook, StepTensors
from probes.records import Event, StepSample

MIN_STEPS_FOR_SKIP_RATIO = 20
SKIP_RATIO = 0.10
SPLIT_WINDOW = 8  # measured steps whose medians the step-split hints read (one step is noisy)
INPUT_SHARE = 0.20  # data wait over this share of the whole cycle (wait + step): input-bound
INPUT_MIN_MS = 2.0  # ... and at least this long (a tiny step's loop overhead is no loader)
OPTIMIZER_SHARE = 0.30  # the optimizer's share of the step ...
OPTIMIZER_MIN_MS = 2.0  # ... and at least this long (a tiny model's update is all overhead)
IDLE_UTIL_PCT = 50.0  # NVML utilisation below this ...
IDLE_STEP_MS = 10.0  # ... while the median step takes at least this long: the GPU idles


def low_precision_share(params: list[torch.Tensor]) -> float:
    """The share of trainable parameter elements stored as fp16/bf16."""
    total = low = 0
    for p in params:
        if p.requires_grad and p.is_floating_point():
            total += p.numel()
            if p.dtype in (torch.float16, torch.bfloat16):
                low += p.numel()
    return low / total if total else 0.0


def tensor_core_problem(amp: str, capability: tuple[int, int] | None) -> str | None:
    """Why ``amp`` gets no tensor cores on a GPU of this compute capability, or None."""
    if capability is None:
        return None
    need = {"fp16": (7, 0), "bf16": (8, 0)}.get(amp)
    if need is None or tuple(capability) >= need:
        return None
    return (f"{amp} autocast on sm {capability[0]}.{capability[1]}: tensor cores for {amp} "
            f"start at sm {need[0]}.{need[1]}")


def cpu_bf16_problem(amp: str, flags: set[str], override: str | None = None) -> str | None:
    """Why bf16 autocast is emulated on this CPU, or None (native, not bf16, flags unknown);
    ``override``: MEMTOP_CPU_BF16's value, which stands in for the flags."""
    return bf16_emulated_why(flags, override) if amp == "bf16" else None


def step_hints(sample: StepSample, synced: bool, warmup: int) -> list[tuple[str, str]]:
    """(hint name, detail) of the per-step pitfalls this sample shows; pure, tested on CPU."""
    out: list[tuple[str, str]] = []
    if sample.scale is not None and sample.scale < 1.0:
        out.append(("scale_collapse", f"scale {sample.scale:g} at step {sample.step}"))
    if sample.step >= MIN_STEPS_FOR_SKIP_RATIO and sample.skipped_steps > SKIP_RATIO * sample.step:
        out.append(("many_skipped_steps", f"{sample.skipped_steps} of {sample.step} steps "
                                          "skipped"))
    cuda = sample.device.startswith("cuda")
    if cuda and not synced and sample.split_step is None and sample.step > warmup:
        # no wait and no step's CUDA events read: this row's step time is the host's
        # (with the split's events it is the device's, wait or not: issue 45)
        out.append(("no_sync_boundary", f"step {sample.step}: {sample.step_ms:.2f} ms of "
                                        "launches"))
    if cuda and sample.step > warmup:
        frag = fragmentation(sample.allocated_bytes, sample.reserved_bytes,
                             alloc_retries=sample.alloc_retries, ooms=sample.ooms)
        if frag is not None and frag.alloc_retries:
            out.append(("alloc_retries", f"{frag.alloc_retries} retries so far"))
        elif frag is not None and frag.hint:
            out.append(("cache_large", f"cache {frag.cached_free_bytes >> 20} MiB free on top "
                                       f"of {(sample.allocated_bytes or 0) >> 20} MiB "
                                       "allocated"))
    return out


SPLIT_HINTS = frozenset({"input_bound", "optimizer_bound", "gpu_idle"})  # split_hints' names


def _median(rows: Sequence[StepSample], name: str) -> float | None:
    vals = [v for v in (getattr(r, name) for r in rows) if v is not None]
    return statistics.median(vals) if len(vals) == len(rows) and vals else None


def split_hints(recent: Sequence[StepSample], optimizer_fast: bool) -> list[tuple[str, str]]:
    """(hint name, detail) of what the step split of the last SPLIT_WINDOW measured steps shows
    (medians, each phase seen on every one of them); pure, tested on CPU. ``optimizer_fast``:
    the optimizer is already foreach or fused, so there is nothing to suggest."""
    out: list[tuple[str, str]] = []
    if len(recent) < SPLIT_WINDOW:
        return out
    step = _median(recent, "step_ms")
    wait = _median(recent, "data_wait_ms")
    if step and wait is not None and wait >= INPUT_MIN_MS and wait / (wait + step) > INPUT_SHARE:
        detail = (f"data wait {wait:.1f} ms against a {step:.1f} ms step "
                  f"({wait / (wait + step):.0%} of the cycle, median of {len(recent)} steps)")
        workers = recent[-1].workers
        if workers:  # it has workers: "give the DataLoader workers" read wrong (user pass)
            detail += (f"; with {workers} DataLoader worker{'s' * (workers > 1)} already: "
                       "more workers, a larger prefetch_factor, persistent_workers=True or "
                       "a cheaper __getitem__")
        out.append(("input_bound", detail))
    opt = _median(recent, "optimizer_ms")
    if step and opt is not None and not optimizer_fast and opt >= OPTIMIZER_MIN_MS \
            and opt / step > OPTIMIZER_SHARE:
        out.append(("optimizer_bound", f"optimizer {opt:.1f} ms of a {step:.1f} ms step "
                                       f"({opt / step:.0%}, median of {len(recent)} steps)"))
    util = _median(recent, "gpu_util_pct")
    if util is not None and step is not None and util < IDLE_UTIL_PCT and step >= IDLE_STEP_MS \
            and recent[-1].device.startswith("cuda"):
        out.append(("gpu_idle", f"GPU busy {util:.0f}% while steps take {step:.1f} ms "
                                f"(median of {len(recent)} steps)"))
    return out


def optimizer_is_fast(optimizer: Any) -> bool:
    """The optimizer already runs its foreach or fused implementation."""
    defaults = getattr(optimizer, "defaults", None)
    return isinstance(defaults, dict) and bool(defaults.get("fused") or defaults.get("foreach"))


def hint_fields(name: str, detail: str) -> dict[str, Any]:
    """A ``hint`` event's fields: its kind's title and why (probes/records/hints.py), and the
    figures of this run that raised it. One shape for the HintWatch and the inference runner."""
    kind = R.HINT_KINDS[name]
    return {"hint": name, "title": kind.title, "why": kind.why, "detail": detail}


class HintWatch(StepHook):
    """Emits each hint of probes.records.HINTS at most once a run."""

    batched = True  # reads only the row: end_step may run in a batch (hooks.py)

    def __init__(self) -> None:
        self.emitted: set[str] = set()
        self._checked_start = False
        self._recent: deque[StepSample] = deque(maxlen=SPLIT_WINDOW)
        self._measured = 0  # steps appended to _recent so far
        self._after_break = False

    def setup(self, ctx: RunContext) -> None:
        super().setup(ctx)
        share = low_precision_share(list(ctx.model.parameters()))
        if share > 0.5:
            self._emit("low_precision_params", 0, f"{share:.0%} of parameter elements")

    def _emit(self, name: str, step: int, detail: str) -> None:
        if name in self.emitted:
            return
        self.emitted.add(name)
        self.ctx.emit(Event(R.HINT, step, self.ctx.elapsed_s(), hint_fields(name, detail)))

    def end_step(self, step: int, tensors: StepTensors, sample: StepSample) -> None:
        if not self._checked_start and self.ctx.device.type == "cpu":
            self._checked_start = True
            problem = cpu_bf16_problem(sample.amp, read_cpu_flags(),  # unknown: no hint
                                       cpu_bf16_override())
            if problem:
                self._emit("cpu_bf16_emulated", step, problem)
        if not self._checked_start and self.ctx.device.type == "cuda":
            self._checked_start = True
            try:
                cap = torch.cuda.get_device_capability(self.ctx.device)
            except Exception:
                cap = None
            problem = tensor_core_problem(sample.amp, cap)
            if problem:
                self._emit("amp_without_tensor_cores", step, problem)
        for name, detail in step_hints(sample, tensors.synced, self.ctx.warmup_steps):
            self._emit(name, step, detail)
        after_pause, self._after_break = self._after_break, False
        if step > self.ctx.warmup_steps and not sample.profiling and not after_pause:
            self._recent.append(sample)  # not traced steps (slower), nor an evaluation's wait
            self._measured += 1
            # once a window, not every step: five medians cost ~60 µs where the step's matmuls
            # have flushed the caches (RESULTS.md, issue 28), and each hint fires once anyway
            if self._measured % SPLIT_WINDOW == 0 and not SPLIT_HINTS <= self.emitted:
                for name, detail in split_hints(self._recent,
                                                optimizer_is_fast(self.ctx.optimizer)):
                    self._emit(name, step, detail)

    def between_steps(self, kind: str) -> None:
        self._after_break = True  # the next step's data wait holds an evaluation, not the loader
