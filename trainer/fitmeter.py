"""Measuring one probe point of `memtop fit` (trainer/fitprobe.py runs them; any model's loop
can, through ``probe_model``): on the training thread, through a Monitor and its ledger.

A point: WARMUP_STEPS steps at the new shape (the first builds per-shape caches and the
optimizer's state), then its rest level (the heap trimmed, CPU: ``malloc_trim``; CUDA: the
allocator's cache emptied), then MEASURED_STEPS steps, the first one measured by the memory
ledger (parameters, gradients, optimizer state, weight copies, saved activations, the heap at
the end of forward). The peak (CPU: the process's RSS high-water mark, VmHWM, reset before each
measured step; CUDA: reserved at the step's end, the cache emptied at rest) is the largest of
the measured steps, their spread its noise. No profiler, no leak watch. An allocation failure
in a step is a point that does not fit: what it held is handed back, the Monitor goes on.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from probes import records as R
from probes.analysis.fit import GUARD, INTERRUPTED, OK, OOM
from probes.counters.host import (
    RssReader,
    host_available_bytes,
    peak_rss_bytes,
    reset_peak_rss,
)
from probes.counters.memory import heap_counters, trim_heap
from probes.instruments.ledger import Ledger
from probes.monitor.monitor import Monitor
from probes.monitor.scope import StepScope

WARMUP_STEPS = 2  # the first step at a shape builds its caches; the second shows it settled
MEASURED_STEPS = 2  # the peak is their largest, their spread the point's noise
_OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory")


def is_oom(exc: BaseException) -> bool:
    """An allocation failure (CUDA's OutOfMemoryError, the CPU allocator's, MemoryError)."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(t in str(exc).lower() for t in _OOM_TEXT)


def default_budget(device: torch.device) -> tuple[int | None, str]:
    """What the run may grow to when --memory is not given: CUDA, the device's free memory
    plus what this process's allocator already holds; CPU, the RAM still available
    (MemAvailable) plus this process's own RSS."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device), "device free + this process's reserved"
    rss = RssReader()
    held = rss.read()
    rss.close()
    available = host_available_bytes()
    if available is None or held is None:
        return None, "RAM available: unreadable here"
    return available + held, "RAM available + this process's RSS"


class PointMeter:
    """Measures probe points through a Monitor and its Ledger (module docstring); the loop's
    step is ``run_step(scope)``, which runs one optimizer step of the point's shape."""

    def __init__(self, mon: Monitor, ledger: Ledger, optimizer: torch.optim.Optimizer,
                 warmup: int = WARMUP_STEPS, steps: int = MEASURED_STEPS) -> None:
        self.mon, self.ledger, self.optimizer = mon, ledger, optimizer
        self.device = mon.device
        self.cuda = self.device.type == "cuda"
        self.warmup, self.steps = warmup, steps
        self.rss = RssReader()
        self.true_peak = not self.cuda and reset_peak_rss()  # VmHWM resettable here
        self.peak_source = ("reserved at the step's end (CUDA caching allocator)" if self.cuda
                            else "process RSS high-water mark (VmHWM)" if self.true_peak
                            else "process RSS at step ends (sampled: VmHWM cannot be reset)")
        self.counter_peak_name = R.peak_name("allocated", self.device.type)

    def measure(self, b: int, t: int, run_step: Callable[[StepScope], Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        point: dict[str, Any] = {"batch_size": b, "seq_len": t, "status": OK,
                                 "peak_source": self.peak_source,
                                 "counter_peak_name": self.counter_peak_name}
        peaks: list[int] = []
        counters: list[int] = []
        times: list[float] = []
        ledger_step = None
        try:
            for _ in range(self.warmup):
                if self._step(run_step) is None:
                    return self._stopped(point, t0)
            rest = self._rest()
            for i in range(self.steps):
                if i == 0:
                    self.ledger.measure_next()
                if not self.cuda and self.true_peak:
                    reset_peak_rss()
                sample = self._step(run_step)
                if sample is None:
                    return self._stopped(point, t0, peaks, counters)
                ledger_step = ledger_step or sample.step
                peaks.append(self._peak(sample))
                counters.append(sample.step_peak_allocated_bytes or 0)
                times.append(sample.step_ms)
        except _OutOfMemory as oom:
            self._free()
            point.update(status=OOM, reason=oom.message, seconds=time.perf_counter() - t0)
            return point
        ledger = self.ledger.latest or {}
        if ledger.get("sampled_step") != ledger_step:
            point.update(status="failed", reason="the ledger did not measure the point's step "
                         f"({self.ledger.failed or 'no measurement'})")
            return point
        point.update(self._parts(rest, ledger, max(peaks), max(counters)))
        point.update(spread=(max(peaks) - min(peaks)) / max(peaks) if max(peaks) else 0.0,
                     steps=self.warmup + self.steps, step_ms=statistics.median(times),
                     seconds=time.perf_counter() - t0,
                     scores_bytes=ledger.get("attention_scores_bytes") or 0)
        return point

    # one step, the rest level, the peak ------------------------------------------------------
    def _step(self, run_step: Callable[[StepScope], Any]) -> Any:
        """One step; its row, or None when the run was asked to stop (Ctrl-C, the guard)."""
        if self.mon.should_stop:
            return None
        failed: BaseException | None = None
        with self.mon.step() as s:
            try:
                run_step(s)
            except Exception as exc:  # an OOM is a point that does not fit, not a failure
                if not is_oom(exc):
                    raise
                failed = exc
        if failed is not None:
            raise _OutOfMemory(f"{type(failed).__name__}: {str(failed).splitlines()[0]}")
        return s.sample

    def _rest(self) -> dict[str, int]:
        """What the run holds between steps, with the free memory handed back first."""
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            return {"allocated": torch.cuda.memory_allocated(self.device),
                    "reserved": torch.cuda.memory_reserved(self.device)}
        trim_heap()
        used, held = heap_counters() or (0, 0)
        return {"heap_used": used, "heap_held": held, "rss": self.rss.read() or 0}

    def _peak(self, sample: Any) -> int:
        if self.cuda:
            return sample.reserved_bytes or 0
        if self.true_peak:
            return peak_rss_bytes() or sample.host_rss_bytes or 0
        return sample.host_rss_bytes or 0

    def _free(self) -> None:
        """After an OOM: what the failed step held goes back (its gradients, the cache)."""
        self.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()
        else:
            trim_heap()

    def _stopped(self, point: dict[str, Any], t0: float, peaks: list[int] | None = None,
                 counters: list[int] | None = None) -> dict[str, Any]:
        guard = self.mon.state.guard_tripped
        point.update(status=GUARD if guard else INTERRUPTED,
                     reason=self.mon.control.stop_reason, seconds=time.perf_counter() - t0)
        if peaks:  # what the steps before the stop measured (the guard's evidence)
            point.update(peak_bytes=max(peaks), counter_peak_bytes=max(counters or [0]))
        return point

    # the parts ---------------------------------------------------------------------------------
    def _parts(self, rest: dict[str, int], ledger: dict[str, Any], peak: int,
               counter_peak: int) -> dict[str, Any]:
        """The peak split into PARTS (probes/analysis/fit.py), each a measured figure; their
        sum is the peak by construction, and the in-counter ones sum to the counter's peak."""
        lines = {ln["name"]: ln.get("measured_bytes") for ln in ledger.get("lines", [])}
        params = lines.get("parameters") or 0
        opt = (lines.get("optimizer state") or 0) + (lines.get("master weights") or 0)
        grads = lines.get("gradients") or 0
        copies = lines.get("autocast weight copies")
        acts = lines.get("saved activations") or 0
        forward = ledger.get("allocated_bytes") or 0  # the counter at the end of forward
        if self.cuda:
            used = rest["allocated"]
            parts = {"parameters": params, "optimizer state": opt,
                     "runtime": used - params - opt, "gradients": grads,
                     "autocast weight copies": copies, "saved activations": acts,
                     "temporaries": counter_peak - used - grads - (copies or 0) - acts,
                     "allocator cache": peak - counter_peak}
        else:
            used, rss = rest["heap_used"], rest["rss"]
            counter_peak = max(counter_peak, forward)
            parts = {"parameters": params, "optimizer state": opt,
                     "runtime heap": used - params - opt, "outside the heap": rss - used,
                     "gradients": grads, "autocast weight copies": copies,
                     "saved activations": acts,
                     "temporaries": counter_peak - used - (copies or 0) - acts,
                     "backward and free heap": peak - rss - (counter_peak - used) - grads}
        return {"parts": parts, "peak_bytes": peak, "counter_peak_bytes": counter_peak,
                "rest": rest}


def probe_model(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                points: list[tuple[int, int]],
                step: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]],
                run_dir: Path, *, warmup: int = WARMUP_STEPS,
                steps: int = MEASURED_STEPS) -> list[dict[str, Any]]:
    """Probe points of any model through a Monitor and its ledger, as `memtop fit` probes
    memtop's GPT: ``step(B, T)`` runs forward and backward on a batch of that shape and
    returns (output, loss); the optimizer's step follows. Its own run folder under
    ``run_dir``; the points' dicts for probes/analysis/fit.py."""
    ledger = Ledger(every=10**12, min_gap_s=math.inf)
    mon = Monitor(model, optimizer, run_dir=run_dir, warmup_steps=0, listen=False,
                  profiler=False, leak_watch=False, ledger=False, extra_hooks=[ledger],
                  write_report=False)
    meter = PointMeter(mon, ledger, optimizer, warmup, steps)
    out = []
    try:
        for b, t in points:
            def run(s: StepScope, b: int = b, t: int = t) -> None:
                output, loss = step(b, t)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                s.set(loss=loss, output=output)

            out.append(meter.measure(b, t, run))
            mon.emit(R.FIT_POINT, mon.step_count, out[-1])
    finally:
        mon.close()
    return out


class _OutOfMemory(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
