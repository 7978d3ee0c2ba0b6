"""Live leak detection: sustained growth of end-of-step memory, told apart from noise and caching.

The test for a leak (docs/ARCHITECTURE.md, instruments): does memory at the end of each step come
back to the same level? A loop that keeps ``loss`` with its graph, or keeps output tensors, grows a
little every step, and that shows in the end-of-step values long before an OOM.

``LeakDetector`` is pure (no torch, no clock): feed it ``(step, value)`` points of any counter and
it returns a ``LeakAlert`` when growth is sustained and a ``LeakCleared`` when the series is flat
again. An alert needs all of these over a trailing window of at least ``min_steps`` deltas:

- a robust slope (Theil–Sen: the median of pairwise slopes) above ``min_rate_bytes`` and above
  ``noise_mult`` times the noise of one step-to-step delta, learned from the series itself: the
  median absolute deviation of second differences, which a steady ramp does not change (a ramp
  adds a constant to every delta and nothing to their differences) and a one-off jump or a
  release moves only as outliers;
- a monotonic rise: the window starts and ends on a rising delta and at least ``rising_fraction``
  of its deltas rise, so one step change (a cache growing once) does not count;
- no release inside the window (a drop bigger than one step's growth), and a total growth of at
  least ``min_growth_bytes``, so an allocator-caching sawtooth does not count;
- a new high: the latest value is above every value of the previous ``high_water_steps`` steps, so
  re-filling a level already reached (the next tooth of a sawtooth) does not count.

Limits: growth that lasts longer than ``high_water_steps`` steps and is then released (a very long
sawtooth) is reported, and cleared when it is released: it is a leak for that long.
``LeakWatch`` is the ``StepHook`` that feeds the detector from a training run.
"""

from __future__ import annotations

import os
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from probes import records as R
from probes.counters.fill import FillForecast, FillTracker, filling_counter
from probes.counters.host import host_available_bytes
from probes.counters.memory import heap_counters
from probes.instruments.hooks import RunContext, StepHook, StepTensors
from probes.instruments.leakcause import likely_cause
from probes.records import Event, StepSample
from probes.tools.stats import theil_sen_slope

_MAD_TO_SIGMA = 1.4826  # median absolute deviation -> standard deviation for normal noise
_SQRT3 = 3 ** 0.5
_NOT_READ: Any = object()  # LeakWatch: a series not read at this step (no point, no gap)


@dataclass
class LeakDetectorConfig:
    """Thresholds of the detector; the defaults fit memtop's default run (see RESULTS.md)."""

    min_steps: int = 4  # fewest step-to-step deltas an alert may rest on
    window_steps: int = 16  # longest stretch the slope is fitted over
    min_rate_bytes: int = 16 * 1024  # slower growth is never reported (Python bookkeeping)
    min_growth_bytes: int = 512 * 1024  # growth the window must add up to before an alert
    noise_mult: float = 4.0  # the slope must exceed this many noise sigmas of a delta
    rising_fraction: float = 0.75  # share of the window's deltas that must rise
    baseline_points: int = 8  # points seen before any alert: the noise floor is learned first
    noise_steps: int = 32  # deltas the noise estimate is taken over
    high_water_steps: int = 32  # how far back "already reached" looks
    clear_steps: int = 5  # flat deltas needed to clear an alert

    def __post_init__(self) -> None:
        for name in ("min_steps", "window_steps", "noise_steps", "clear_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value}")
        for name in ("min_rate_bytes", "min_growth_bytes", "baseline_points", "high_water_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be zero or a positive integer, got {value}")
        if self.window_steps < self.min_steps:
            raise ValueError(f"window_steps ({self.window_steps}) must be at least min_steps "
                             f"({self.min_steps})")
        if not self.noise_mult > 0:
            raise ValueError(f"noise_mult must be greater than zero, got {self.noise_mult}")
        if not 0 < self.rising_fraction <= 1:
            raise ValueError(f"rising_fraction must be in (0, 1], got {self.rising_fraction}")


@dataclass(frozen=True)
class LeakAlert:
    """Sustained growth was found: the figures behind a ``leak_suspected`` event."""

    counter: str
    step: int  # the step at which the alert was raised
    since_step: int  # the first step whose end value grew
    bytes_per_step: float  # Theil–Sen slope over the window
    window_steps: int  # deltas the slope was fitted over
    value_bytes: int  # the counter at ``step``
    growth_bytes: int  # growth across the window
    noise_bytes: float  # noise sigma of one delta, as learned
    threshold_bytes: float  # the slope the alert had to beat


@dataclass(frozen=True)
class LeakCleared:
    """The series stopped growing (dropped, or flat) after an alert."""

    counter: str
    step: int  # the step at which the alert was cleared
    since_step: int  # the first step that no longer grew
    alert: LeakAlert


def _deltas(points: Sequence[tuple[int, int]]) -> list[float]:
    return [(b[1] - a[1]) / max(1, b[0] - a[0]) for a, b in zip(points, points[1:], strict=False)]


def _fit(points: Sequence[tuple[int, int]]) -> float:
    return theil_sen_slope([p[0] for p in points], [p[1] for p in points])


class LeakDetector:
    """Watches one series of end-of-step values; see the module docstring for the rule."""

    def __init__(self, counter: str = "series", config: LeakDetectorConfig | None = None) -> None:
        self.counter = counter
        self.config = config or LeakDetectorConfig()
        cfg = self.config
        # the current stretch of comparable points; a gap (ignored steps, a pause) starts a new one
        self._points: deque[tuple[int, int]] = deque(
            maxlen=cfg.window_steps + cfg.high_water_steps + 2)
        self._second: deque[float] = deque(maxlen=cfg.noise_steps)  # differences of deltas
        self._last_delta: float | None = None
        self._seen = 0
        self.active: LeakAlert | None = None

    # what was learned ----------------------------------------------------------------------------
    @property
    def noise_bytes(self) -> float:
        """Noise sigma of one step-to-step delta.

        For white noise of sigma s on the values, a delta has sigma s·√2 and a second difference
        s·√6, hence the √3; MAD × 1.4826 is the robust sigma.
        """
        if len(self._second) < 3:
            return 0.0
        mid = statistics.median(self._second)
        mad = statistics.median(abs(d - mid) for d in self._second)
        return _MAD_TO_SIGMA * mad / _SQRT3

    @property
    def threshold_bytes(self) -> float:
        """The slope (bytes/step) that counts as growth: the floor, or above the noise."""
        return max(float(self.config.min_rate_bytes), self.config.noise_mult * self.noise_bytes)

    # feeding -------------------------------------------------------------------------------------
    def mark_gap(self) -> None:
        """The next point is not comparable with the last one (skipped steps, a pause)."""
        self._points.clear()
        self._last_delta = None

    def feed(self, step: int, value: int) -> LeakAlert | LeakCleared | None:
        """Add the end-of-step value of ``step``; returns an alert or a clear when one happens."""
        if self._points and step <= self._points[-1][0]:
            self.mark_gap()  # steps went backwards: a new series
        self._points.append((step, int(value)))
        self._seen += 1
        if len(self._points) >= 2:
            (s0, v0), (s1, v1) = self._points[-2], self._points[-1]
            delta = (v1 - v0) / max(1, s1 - s0)  # _deltas of the last two, without the lists
            if self._last_delta is not None:
                self._second.append(delta - self._last_delta)
            self._last_delta = delta
        if self.active is not None:
            return self._check_clear(step)
        if self._seen < self.config.baseline_points:
            return None
        self.active = self._check_growth(step)
        return self.active

    # the rules -----------------------------------------------------------------------------------
    def _check_growth(self, step: int) -> LeakAlert | None:
        cfg = self.config
        if len(self._points) < cfg.min_steps + 1:
            return None
        # cheapest exit first (issue 28): the threshold is never below min_rate_bytes, so a last
        # delta under half of that cannot be rising, whatever the noise (no medians per step)
        if self._last_delta is None or self._last_delta < 0.5 * cfg.min_rate_bytes:
            return None
        points = list(self._points)
        threshold = self.threshold_bytes
        rise = 0.5 * threshold  # a delta at least this big counts as rising
        if _deltas(points[-2:])[0] < rise:
            return None  # cheap exit: the last step did not grow
        noise = self.noise_bytes
        for n in range(min(cfg.window_steps, len(points) - 1), cfg.min_steps - 1, -1):
            tail = points[-(n + 1):]
            deltas = _deltas(tail)
            if deltas[0] < rise or sum(d >= rise for d in deltas) < cfg.rising_fraction * n:
                continue
            growth = tail[-1][1] - tail[0][1]
            if growth < cfg.min_growth_bytes:
                continue
            slope = _fit(tail)
            if slope < threshold or min(deltas) < -max(cfg.noise_mult * noise, slope):
                continue
            before = [v for s, v in points[:-(n + 1)] if s >= tail[0][0] - cfg.high_water_steps]
            if before and tail[-1][1] <= max(before) + threshold:
                continue  # climbing back to a level already reached: caching, not a leak
            return LeakAlert(
                counter=self.counter, step=step, since_step=self._since(points, rise),
                bytes_per_step=slope, window_steps=n, value_bytes=tail[-1][1],
                growth_bytes=growth, noise_bytes=noise, threshold_bytes=threshold)
        return None

    @staticmethod
    def _since(points: list[tuple[int, int]], rise: float) -> int:
        """The first step of the trailing run of rising deltas."""
        since = points[-1][0]
        for a, b in zip(reversed(points[:-1]), reversed(points), strict=False):
            if _deltas([a, b])[0] < rise:
                break
            since = b[0]
        return since

    def _check_clear(self, step: int) -> LeakCleared | None:
        alert = self.active
        assert alert is not None
        points = list(self._points)[-(self.config.clear_steps + 1):]
        if len(points) < self.config.clear_steps + 1:
            return None  # just after a gap: wait for enough comparable points
        rise = 0.5 * alert.threshold_bytes
        rising = [i for i, d in enumerate(_deltas(points)) if d >= rise]
        if len(rising) > 1 or (rising and rising[-1] == len(points) - 2) or _fit(points) >= rise:
            return None  # still growing (one stray rising delta is noise, the last one is not)
        since = points[rising[-1] + 2][0] if rising else points[1][0]
        self.active = None
        return LeakCleared(counter=self.counter, step=step, since_step=since, alert=alert)


def forecast_fields(fc: FillForecast | None) -> dict[str, Any]:
    """A forecast as event fields (leak_suspected, leak_forecast); None values without one."""
    if fc is None:
        return {"fill_counter": None, "limit_name": None, "capacity_bytes": None,
                "fill_bytes_per_step": None, "steps_to_full": None, "seconds_to_full": None}
    return {"fill_counter": fc.counter, "limit_name": fc.limit_name,
            "capacity_bytes": fc.room_bytes, "fill_bytes_per_step": int(round(fc.bytes_per_step)),
            "steps_to_full": fc.steps_to_full, "seconds_to_full": fc.seconds_to_full}


# the hook ----------------------------------------------------------------------------------------
class LeakWatch(StepHook):
    """Feeds end-of-step device allocated (CUDA) and the host heap to a detector each, and emits
    ``leak_suspected`` / ``leak_cleared`` events.

    On CPU the sampled "allocated" is the host heap, so there is one series (process RSS where
    glibc's mallinfo2 is missing: coarser, but it still grows with a leak). Warmup steps, steps
    the profiler traced (``sample.profiling``: its wait, warmup and active steps, not the
    table's analysis, which runs in a child process) and ``settle_steps`` after them (the
    trace's export frees the profiler's buffers into the next steps' heap readings),
    and the jump across a pause (the UI thread allocates in the same heap meanwhile) or across
    an evaluation or a checkpoint save between steps (``between_steps``) are left out.

    On CUDA the host heap (a mallinfo2 walk, 5–100 µs) is read every ``host_heap_every`` steps
    (issue 28); its detector fits bytes/step over the steps it gets, so a host leak is found
    ``host_heap_every`` times more steps later. The device series is fed every step.
    """

    batched = True  # reads only the row: end_step may run in a batch (hooks.py)

    FORECAST_EVERY_S = 3.0  # while an alert is open, its time to full is recomputed this often

    def __init__(self, config: LeakDetectorConfig | None = None, settle_steps: int = 3,
                 pause_gap_s: float = 1.0, host_heap_every: int = 10) -> None:
        if settle_steps < 0:
            raise ValueError(f"settle_steps must be zero or positive, got {settle_steps}")
        if not isinstance(host_heap_every, int) or host_heap_every < 1:
            raise ValueError(f"host_heap_every must be a positive integer, got {host_heap_every}")
        self.host_heap_every = host_heap_every
        if not pause_gap_s > 0:
            raise ValueError(f"pause_gap_s must be greater than zero, got {pause_gap_s}")
        self.config = config or LeakDetectorConfig()
        self.settle_steps = settle_steps
        self.pause_gap_s = pause_gap_s
        self.detectors: dict[str, LeakDetector] = {}
        self.alerts: dict[str, dict[str, Any]] = {}  # counter -> data of the open alert
        self.ignored_steps = 0  # warmup, profiler window and settling steps
        self.pauses_seen = 0
        self._warmup = 0
        self._settle_until = 0
        self._prev_time_s: float | None = None
        self._is_cuda = False
        self._available_at_s: float | None = None  # when MemAvailable was last read
        self._available: int | None = None
        self.fill = FillTracker()  # the counter that fills the limit (probes/counters/fill.py)
        self._limit: int | None = None
        self._sharers = 1
        self._forecast_at_s: float | None = None

    def setup(self, ctx: RunContext) -> None:
        super().setup(ctx)
        self._warmup = ctx.warmup_steps
        self._is_cuda = ctx.device.type == "cuda"
        host = "host_heap" if heap_counters() is not None else "host_rss"  # RSS: not glibc
        counters = ("device_allocated", host) if self._is_cuda else (host,)
        self.detectors = {name: LeakDetector(name, self.config) for name in counters}
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
        if sample.profiling:
            self._settle_until = step + self.settle_steps
        if step <= self._warmup or sample.profiling or step <= self._settle_until:
            self.ignored_steps += 1
            self._gap()
            return
        if gap_s is not None and gap_s > self.pause_gap_s:
            self.pauses_seen += 1
            self._gap()  # paused: the next delta starts after the pause
        values = {"device_allocated": sample.allocated_bytes, "host_heap": sample.allocated_bytes,
                  "host_rss": sample.host_rss_bytes}
        if not tensors.heap_fresh:  # CPU: the row repeats an earlier heap read (its cost)
            values["host_heap"] = _NOT_READ
        elif self._is_cuda:
            if step % self.host_heap_every == 0:
                heap = heap_counters()
                values["host_heap"] = heap[0] if heap else None
            else:
                values["host_heap"] = _NOT_READ  # not this step's turn: no point, no gap
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
            result = detector.feed(step, value)
            if isinstance(result, LeakAlert):
                self._suspected(result, sample, output_bytes)
            elif isinstance(result, LeakCleared):
                alert = self.alerts.pop(name, None) or {}
                self.ctx.emit(Event(R.LEAK_CLEARED, step, self.ctx.elapsed_s(), {
                    "counter": name, "since_step": result.since_step,
                    "alert_step": result.alert.step, "host_rss_bytes": sample.host_rss_bytes,
                    "alert_rss_bytes": alert.get("host_rss_bytes")}))
        self._maybe_forecast(step, sample)

    def _where(self, sample: StepSample) -> tuple[str, str, int, int] | None:
        return filling_counter(
            "cuda" if self._is_cuda else "cpu", self._limit, rss_bytes=sample.host_rss_bytes,
            reserved_bytes=sample.reserved_bytes, driver_used_bytes=sample.driver_used_bytes,
            device_total_bytes=self.ctx.device_total_bytes,
            host_available=None if self._is_cuda or self._limit else
            self._host_available(sample.time_s))

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
        are not compared (its buffers and caches are not a step's growth)."""
        self._gap()

    def _gap(self) -> None:
        self.fill.mark_gap()
        for detector in self.detectors.values():
            detector.mark_gap()

    def _suspected(self, alert: LeakAlert, sample: StepSample, output_bytes: int) -> None:
        self._forecast_at_s = sample.time_s
        cause, hint = likely_cause(alert.counter, alert.bytes_per_step, output_bytes)
        data = {
            "counter": alert.counter, "bytes_per_step": int(round(alert.bytes_per_step)),
            "since_step": alert.since_step, "window_steps": alert.window_steps,
            "hint": hint, "likely_cause": cause, "host_rss_bytes": sample.host_rss_bytes,
        }
        data.update(forecast_fields(self.forecast(sample, data)))
        self.alerts[alert.counter] = dict(data)  # updated by forecasts; the event is not
        self.ctx.emit(Event(R.LEAK_SUSPECTED, alert.step, self.ctx.elapsed_s(), data))

    def stats(self) -> dict[str, Any]:
        """What the detectors learned, for reports and benchmarks."""
        return {name: {"noise_bytes": d.noise_bytes, "threshold_bytes": d.threshold_bytes,
                       "active": asdict(d.active) if d.active else None}
                for name, d in self.detectors.items()}
