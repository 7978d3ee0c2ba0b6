"""`memtop fit`'s measuring side: probe points (B, T) run on the training thread, each to a
steady state, their peak split into measured parts (probes/analysis/fit.py PARTS).

A point: WARMUP_STEPS steps at the new shape (the first builds per-shape caches and the
optimizer's state), then its rest level (the heap trimmed, CPU: ``malloc_trim``; CUDA: the
allocator's cache emptied), then MEASURED_STEPS steps, the first one measured by the memory
ledger (parameters, gradients, optimizer state, weight copies, saved activations, the heap at
the end of forward). The peak (CPU: the process's RSS high-water mark, VmHWM, reset before each
measured step; CUDA: reserved at the step's end, the cache emptied at rest) is the largest of
the measured steps, their spread its noise. No profiler, no leak watch.

    python -m trainer.fitprobe --config '{...}' --points 20x128 --budget BYTES --run-folder DIR

runs one point in a fresh process (`memtop fit --verify`): the prediction is for a fresh run,
which holds one shape's caches, not the probe's. The budget is then the run's --max-memory, so a
step over it on CPU is stopped by the memory guard (exit 3), not by the kernel.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from probes import records as R
from probes.analysis.fit import (
    DEFAULT_HEADROOM_PCT,
    GUARD,
    INTERRUPTED,
    NOT_RUN,
    OK,
    OOM,
    OVER,
    FitError,
    fit_points,
    model_size_problem,
)
from probes.analysis.fit_answer import answer, refine_points
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
from trainer.config import TrainConfig
from trainer.data import BatchSampler, load_corpus
from trainer.loop import Trainer

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


class FitProbe(Trainer):
    """memtop's trainer running probe points instead of a training run: the same model,
    optimizer, amp and Monitor (trainer/loop.py), each point's step ``Trainer.train_step``.

    ``on_point(probe)`` is called on the training thread after each point (fit.json is
    rewritten there: an interrupted probe leaves a valid partial file). ``refused``: bad input
    found once the device is known (a budget below the model's own size), said in one line."""

    thread_name = "memtop-fit"

    def __init__(self, config: TrainConfig, run_dir: Path, points: list[tuple[int, int]], *,
                 budget_bytes: int | None = None, headroom_pct: float = DEFAULT_HEADROOM_PCT,
                 refine: bool = True, on_point: Callable[[FitProbe], None] | None = None,
                 warmup: int = WARMUP_STEPS, steps: int = MEASURED_STEPS, **kw: Any) -> None:
        self.ledger = Ledger(every=10**12, min_gap_s=math.inf)
        super().__init__(config, run_dir, hooks=[self.ledger], **kw)
        self.plan = list(points)
        self.points: list[dict[str, Any]] = []
        self.budget_bytes = budget_bytes
        self.budget_source = "--memory" if budget_bytes is not None else ""
        self.headroom_pct, self.refine = headroom_pct, refine
        self.on_point = on_point
        self.warmup, self.steps = warmup, steps
        self.refused: str | None = None
        self.params = 0
        self.peak_source = ""
        self.amp = ""
        self.device_text = ""  # the device the probe ran on, once known

    def _train(self, mon: Monitor, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               scaler: torch.amp.GradScaler | None, batches: BatchSampler,
               device: torch.device, amp: str) -> None:
        self.amp, self.device_text = amp, str(device)
        self.params = sum(p.numel() for p in model.parameters())
        if self.budget_bytes is None:
            self.budget_bytes, self.budget_source = default_budget(device)
        if self.budget_bytes is not None:
            self.refused = model_size_problem(self.budget_bytes, self.params,
                                              f"the budget ({self.budget_source})")
            if self.refused:
                return
        model.train()
        meter = PointMeter(mon, self.ledger, optimizer, self.warmup, self.steps)
        self.peak_source = meter.peak_source
        corpus = load_corpus()

        def run_points(plan: list[tuple[int, int]], role: str) -> bool:
            for i, (b, t) in enumerate(plan):
                sampler = BatchSampler(corpus, b, t, self.config.seed, device)

                def run_step(s: StepScope, sampler: BatchSampler = sampler) -> None:
                    x, y = sampler.next_batch()
                    self.train_step(s, model, optimizer, scaler, x, y, device, amp)
                    s.set(tokens=x.numel())

                point = meter.measure(b, t, run_step)
                point["role"] = role
                budget = self.budget_bytes
                if point["status"] == OK and budget is not None \
                        and point["peak_bytes"] > budget:
                    point.update(status=OVER, reason="its measured peak is over the budget")
                self._record(mon, point)
                if point["status"] != OK:
                    why = {OVER: "a smaller point was over the budget",
                           OOM: "a smaller point ran out of memory"}.get(
                        point["status"], "the probe was stopped first")
                    for b2, t2 in plan[i + 1:]:
                        self._record(mon, {"batch_size": b2, "seq_len": t2, "status": NOT_RUN,
                                           "reason": why, "role": role})
                    return False
            return True

        if run_points(self.plan, "probe") and self.refine:
            run_points(self._refine_plan(), "refine")

    def _refine_plan(self) -> list[tuple[int, int]]:
        """Points between the probe and its answer (probes/analysis/fit_answer.py
        refine_points), where the answer lies far past the probed sizes."""
        cfg = self.config
        try:
            fit = fit_points(self.points, self.device_text)
        except FitError:
            return []
        if self.budget_bytes is None:
            return []
        ans = answer(fit, self.budget_bytes, self.headroom_pct, cfg.batch_size, cfg.seq_len,
                     cfg.block_size)
        done = {(p["batch_size"], p["seq_len"]) for p in self.points}
        return [p for p in refine_points(fit, ans) if p not in done]

    def _record(self, mon: Monitor, point: dict[str, Any]) -> None:
        self.points.append(point)
        mon.emit(R.FIT_POINT, mon.step_count, point)
        if self.on_point is not None:
            self.on_point(self)


def main(argv: list[str] | None = None) -> int:
    """One verification point in a fresh process (`memtop fit --verify`)."""
    parser = argparse.ArgumentParser(prog="python -m trainer.fitprobe",
                                     description="Run memtop fit's probe points in this "
                                                 "process (its --verify runs one each).")
    parser.add_argument("--run-folder", required=True)
    parser.add_argument("--config", required=True, help="TrainConfig as JSON")
    parser.add_argument("--points", required=True, help="BxT[,BxT...], e.g. 20x128")
    parser.add_argument("--budget", type=int, default=None, help="bytes; the memory guard's "
                                                                  "limit too")
    parser.add_argument("--steps", type=int, default=MEASURED_STEPS + 1)
    args = parser.parse_args(argv)
    from trainer.rank import _stop_on_signals, die_with_parent

    die_with_parent()
    try:
        points = [tuple(int(v) for v in p.split("x")) for p in args.points.split(",")]
        config = TrainConfig.from_json(json.loads(args.config))
    except ValueError as exc:
        print(f"memtop fitprobe: {exc}", file=sys.stderr)
        return 2
    probe = FitProbe(config, Path(args.run_folder), points, budget_bytes=args.budget,
                     steps=args.steps, refine=False, listen=False)
    _stop_on_signals(probe.control)
    probe.start()
    while not probe.join(timeout=0.2):
        pass
    return 1 if probe.exit_code is None else probe.exit_code


if __name__ == "__main__":
    sys.exit(main())
