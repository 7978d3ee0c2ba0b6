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
``LeakWatch`` (leakwatch.py) is the ``StepHook`` that feeds the detector from a training run.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from probes.tools.stats import theil_sen_slope

_MAD_TO_SIGMA = 1.4826  # median absolute deviation -> standard deviation for normal noise
_SQRT3 = 3 ** 0.5


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
    since_step: int  # the first step whose growth is the leak's (LeakDetector._since)
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
                counter=self.counter, step=step,
                since_step=self._since(points, max(rise, 0.5 * slope)),
                bytes_per_step=slope, window_steps=n, value_bytes=tail[-1][1],
                growth_bytes=growth, noise_bytes=noise, threshold_bytes=threshold)
        return None

    @staticmethod
    def _since(points: list[tuple[int, int]], rise: float) -> int:
        """The first step whose growth is the leak's: the first of the trailing run of deltas of
        at least ``rise``, half the leak's fitted rate (never below half the threshold). Half the
        rate, not half the threshold: a step of noise or one small allocation just before the
        leak (+10 KiB beside a 150 KiB/step leak) clears the threshold's half and moved "since"
        a step earlier in some runs (issue 38). A leak that starts keeping tensors in step N
        shows first in step N + 1's end value: a step's own loss and output are alive when its
        memory is read (the Monitor holds them), so what step N keeps adds to step N + 1."""
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

