"""The leak watch: the ``StepHook`` that feeds end-of-step memory to a ``LeakDetector`` per counter
(leak.py, the rule), emits ``leak_suspected`` / ``leak_cleared`` events and, while an alert is open,
``leak_forecast`` events with the time until the counter that fills the limit is full.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

from probes import records as R
from probes.counters.fill import (
    FILL_FIT_POINTS,
    LEAK_FILL_WINDOW_STEPS,
    FillForecast,
    FillTracker,
    filling_counter,
)
from probes.counters.host import host_available_bytes
from probes.counters.memory import heap_counters
from probes.instruments.hooks import RunContext, StepHook, StepTensors
from probes.instruments.leak import LeakAlert, LeakCleared, LeakDetector, LeakDetectorConfig
from probes.instruments.leakcause import likely_cause
from probes.instruments.workerwatch import WorkersSeries, host_where
from probes.records import WORKERS_COUNTER, Event, StepSample

__all__ = ["LeakWatch", "forecast_fields", "likely_cause"]

_NOT_READ: Any = object()  # a series not read at this step (no point, no gap)


def forecast_fields(fc: FillForecast | None) -> dict[str, Any]:
    """A forecast as event fields (leak_suspected, leak_forecast); None values without one."""
    if fc is None:
        return {"fill_counter": None, "limit_name": None, "capacity_bytes": None,
                "fill_bytes_per_step": None, "steps_to_full": None, "seconds_to_full": None}
    return {"fill_counter": fc.counter, "limit_name": fc.limit_name,
            "capacity_bytes": fc.room_bytes, "fill_bytes_per_step": int(round(fc.bytes_per_step)),
            "steps_to_full": fc.steps_to_full, "seconds_to_full": fc.seconds_to_full}


class LeakWatch(StepHook):
    """Feeds end-of-step device allocated (CUDA) and the host heap to a detector each, and emits
    ``leak_suspected`` / ``leak_cleared`` events.

    On CPU the sampled "allocated" is the host heap, so there is one series (process RSS where
    glibc's mallinfo2 is missing: coarser, but it still grows with a leak). Warmup steps, the
    steps memtop's own diagnosis disturbed (``sample.disturbed``, probes/records/disturbed.py:
    a profiler window's traced steps, those while its table is computed and the ones settling
    after it, a culprit look's steps and the one after: tracemalloc grows the heap), a traced
    row's ``settle_steps`` after it where a row does not say (built without the session),
    and the jump across a pause (the UI thread allocates in the same heap meanwhile) or across
    an evaluation or a checkpoint save between steps (``between_steps``) are left out.

    On CUDA the host heap (a mallinfo2 walk, 5–100 µs) is read by the memory probe at the
    step's end at its budgeted rate (every step while it is cheap, else every k-th: issue 45,
    probes/counters/memory.py) and handed over with the step (``tensors.host_heap_bytes``); the
    steps between are neither points nor gaps, and the detector fits bytes/step over the steps
    it gets. The device series is fed every step.

    The DataLoader workers' private bytes are one more series (workerwatch.py), fed at each
    new reading of the workers' sampler (about once a second), warmup and disturbed steps
    included: their memory is another process's.
    """

    batched = True  # reads only the row: end_step may run in a batch (hooks.py)
    wants_host_heap = True  # CUDA: the memory probe reads the host heap for it (memory.py)

    FORECAST_EVERY_S = 3.0  # while an alert is open, its time to full is recomputed this often

    def __init__(self, config: LeakDetectorConfig | None = None, settle_steps: int = 3,
                 pause_gap_s: float = 1.0) -> None:
        if settle_steps < 0:
            raise ValueError(f"settle_steps must be zero or positive, got {settle_steps}")
        if not pause_gap_s > 0:
            raise ValueError(f"pause_gap_s must be greater than zero, got {pause_gap_s}")
        self.config = config or LeakDetectorConfig()
        self.settle_steps = settle_steps
        self.pause_gap_s = pause_gap_s
        self.detectors: dict[str, LeakDetector] = {}
        self.alerts: dict[str, dict[str, Any]] = {}  # counter -> data of the open alert
        self.ignored_steps = 0  # warmup and disturbed steps (profiler window, culprit look)
        self.pauses_seen = 0
        self._warmup = 0
        self._settle_until = 0
        self._prev_time_s: float | None = None
        self._is_cuda = False
        self._available_at_s: float | None = None  # when MemAvailable was last read
        self._available: int | None = None
        # the counter that fills the limit, its rate since the leak began over up to 512 steps
        # (probes/counters/fill.py): an ETA that does not flip with RSS's chunks
        self.fill = FillTracker(LEAK_FILL_WINDOW_STEPS, FILL_FIT_POINTS)
        self._limit: int | None = None
        self._sharers = 1
        self._forecast_at_s: float | None = None
        self.workers: WorkersSeries | None = None

    def setup(self, ctx: RunContext) -> None:
        super().setup(ctx)
        self._warmup = ctx.warmup_steps
        self._is_cuda = ctx.device.type == "cuda"
        host = "host_heap" if heap_counters() is not None else "host_rss"  # RSS: not glibc
        counters = ("device_allocated", host) if self._is_cuda else (host,)
        self.detectors = {name: LeakDetector(name, self.config) for name in counters}
        if ctx.workers is not None:
            self.workers = WorkersSeries()
            self.detectors[WORKERS_COUNTER] = self.workers.detector
        self._limit = ctx.max_memory_bytes
        # ranks on one host fill its RAM together; a GPU is one rank's (or --max-memory is)
        local = os.environ.get("LOCAL_WORLD_SIZE", "1")
        self._sharers = int(local) if (local.isdigit() and not self._is_cuda
                                       and self._limit is None) else 1

    def end_step(self, step: int, tensors: StepTensors, sample: StepSample) -> None:
        gap_s = None
        if self._prev_time_s is not None:
            gap_s = sample.time_s - self._prev_time_s - sample.step_ms / 1000.0
        self._prev_time_s = sample.time_s
        paused = gap_s is not None and gap_s > self.pause_gap_s
        if self.workers is not None:
            self._feed_workers(step, tensors, sample, paused)
        if sample.profiling:  # (a row built without the session's rule still settles)
            self._settle_until = step + self.settle_steps
        if step <= self._warmup or sample.disturbed is not None or sample.profiling \
                or step <= self._settle_until:
            self.ignored_steps += 1
            self._gap()
            return
        if paused:
            self.pauses_seen += 1
            self._gap()  # paused: the next delta starts after the pause
        values = {"device_allocated": sample.allocated_bytes, "host_heap": sample.allocated_bytes,
                  "host_rss": sample.host_rss_bytes, WORKERS_COUNTER: _NOT_READ}
        if not tensors.heap_fresh:  # CPU: the row repeats an earlier heap read (its cost)
            values["host_heap"] = _NOT_READ
        elif self._is_cuda:  # read at the step's end when its turn came (memory.py)
            heap = tensors.host_heap_bytes
            values["host_heap"] = heap if heap is not None else _NOT_READ  # else no point
        output_bytes = tensors.output_bytes
        where = self._where(sample)
        self.fill.feed(step, sample.time_s, where[2] if where else None)
        for name, detector in self.detectors.items():
            value = values[name]
            if value is _NOT_READ:
                continue
            if value is None:
                detector.mark_gap()
                continue
            self._result(detector.feed(step, value), sample, output_bytes)
        self._maybe_forecast(step, sample)

    def _result(self, result: LeakAlert | LeakCleared | None, sample: StepSample,
                output_bytes: int | None) -> None:
        if isinstance(result, LeakAlert):
            self._suspected(result, sample, output_bytes)
        elif isinstance(result, LeakCleared):
            alert = self.alerts.pop(result.counter, None) or {}
            self.ctx.emit(Event(R.LEAK_CLEARED, sample.step, self.ctx.elapsed_s(), {
                "counter": result.counter, "since_step": result.since_step,
                "alert_step": result.alert.step, "host_rss_bytes": sample.host_rss_bytes,
                "alert_rss_bytes": alert.get("host_rss_bytes")}))

    def _feed_workers(self, step: int, tensors: StepTensors, sample: StepSample,
                      paused: bool) -> None:
        """The workers' series (workerwatch.py): a point at each new reading, and the
        trainer's own memory beside it, so an alert can say whether the trainer is flat."""
        series = self.workers
        assert series is not None
        if step > 1 and sample.disturbed is None and not sample.profiling and (
                tensors.heap_fresh or self._is_cuda):
            series.trainer_point(step, sample.allocated_bytes if sample.allocated_bytes
                                 is not None else sample.host_rss_bytes)
        if paused:
            series.mark_gap()
        if tensors.workers is not None:
            self._result(series.feed(step, tensors.workers, sample), sample, None)

    def _where(self, sample: StepSample) -> tuple[str, str, int, int] | None:
        return filling_counter(
            "cuda" if self._is_cuda else "cpu", self._limit, rss_bytes=sample.host_rss_bytes,
            reserved_bytes=sample.reserved_bytes, driver_used_bytes=sample.driver_used_bytes,
            device_total_bytes=self.ctx.device_total_bytes,
            host_available=None if self._is_cuda or self._limit else
            self._host_available(sample.time_s), workers_bytes=sample.workers_uss_bytes)

    def _host_available(self, now_s: float) -> int | None:
        """MemAvailable, read at most once a second: /proc/meminfo costs ~50 µs, the step
        path's whole budget (issue 28), and the room it gives changes slowly."""
        if self._available_at_s is None or now_s - self._available_at_s >= 1.0:
            self._available_at_s, self._available = now_s, host_available_bytes()
        return self._available

    def forecast(self, sample: StepSample, alert: dict[str, Any] | None = None
                 ) -> FillForecast | None:
        """Time to full of the counter that fills the limit, at its rate now (since the leak
        began, when it began inside the window, and never slower than the leak itself)."""
        alert = alert or {}
        if alert.get("counter") == WORKERS_COUNTER and self.workers is not None:
            limit = None if self._is_cuda else self._limit  # CUDA's --max-memory: the device's
            return self.workers.forecast(
                host_where(sample, limit, None if limit else self._host_available(sample.time_s)),
                self._sharers if limit is None else 1, alert)
        return self.fill.forecast(self._where(sample), self._sharers, alert.get("since_step"),
                                  float(alert.get("bytes_per_step") or 0.0))

    def _maybe_forecast(self, step: int, sample: StepSample) -> None:
        """While an alert is open, recompute its time to full every few seconds."""
        if not self.alerts:
            return
        if (self._forecast_at_s is not None
                and sample.time_s - self._forecast_at_s < self.FORECAST_EVERY_S):
            return
        self._forecast_at_s = sample.time_s
        for counter, alert in self.alerts.items():
            data = forecast_fields(self.forecast(sample, alert))
            alert.update(data)
            self.ctx.emit(Event(R.LEAK_FORECAST, step, self.ctx.elapsed_s(),
                                {"counter": counter, **data}))

    def between_steps(self, kind: str) -> None:
        """An evaluation or a checkpoint save ran since the last step: the steps on either side
        are not compared (its buffers and caches are not a step's growth, nor its loader's
        workers' start-up)."""
        self._gap()
        if self.workers is not None:
            self.workers.mark_gap()

    def _gap(self) -> None:
        """The trainer's series start again (the workers' have their own gaps)."""
        self.fill.mark_gap()
        for name, detector in self.detectors.items():
            if name != WORKERS_COUNTER:
                detector.mark_gap()

    def _suspected(self, alert: LeakAlert, sample: StepSample, output_bytes: int) -> None:
        self._forecast_at_s = sample.time_s
        data = {
            "counter": alert.counter, "bytes_per_step": int(round(alert.bytes_per_step)),
            "since_step": alert.since_step, "window_steps": alert.window_steps,
            "host_rss_bytes": sample.host_rss_bytes,
        }
        if alert.counter == WORKERS_COUNTER and self.workers is not None:
            trainer = [d for n, d in self.detectors.items() if n != WORKERS_COUNTER]
            data.update(self.workers.alert_fields(
                alert, max(d.threshold_bytes for d in trainer),
                any(d.active is not None for d in trainer)))
        else:
            data["likely_cause"], data["hint"] = likely_cause(alert.counter, alert.bytes_per_step,
                                                              output_bytes)
        data.update(forecast_fields(self.forecast(sample, data)))
        self.alerts[alert.counter] = dict(data)  # updated by forecasts; the event is not
        self.ctx.emit(Event(R.LEAK_SUSPECTED, alert.step, self.ctx.elapsed_s(), data))

    def stats(self) -> dict[str, Any]:
        """What the detectors learned, for reports and benchmarks."""
        return {name: {"noise_bytes": d.noise_bytes, "threshold_bytes": d.threshold_bytes,
                       "active": asdict(d.active) if d.active else None}
                for name, d in self.detectors.items()}
