"""Time to full: when the counter that actually fills the limit reaches it, at its own rate.

One rule for the leak banner (probes/instruments/leak.py) and the memory guard
(probes/monitor/guard.py), so the two never tell different stories. The counter that fills is
not the one that leaks: a retained graph grows the heap by 150 KiB/step while RSS, what the
kernel and ``--max-memory`` count, grows by MiBs. So the forecast follows

- on CPU: host RSS against ``--max-memory``; without one, against the RAM still available to
  the whole host (MemAvailable), its rate times the ranks on this host (they grow together);
  with the trainer's DataLoader workers' private bytes added where it has workers (they fill
  the same RAM: issue 43);
- on CUDA: reserved against ``--max-memory``; without one, the driver's used (every process on
  the device) against the device's total.

Its rate is a Theil–Sen slope over the last ``window_steps`` comparable steps, refitted at every
call, so the ETA follows the rate as it changes. The time left sums the steps still to come at a
step time that keeps its trend: a leak slows the steps it leaks in (a retained graph's objects
make each garbage collection longer: memtop's graph demo went from 55 to 145 ms a step on its way
to 10 GiB), so the last steps' median alone said "full" ~30% too early (benchmarks/RESULTS.md,
issue 30). The trend is fitted to the medians of ``TREND_BLOCK_STEPS``-step blocks of the last
``TREND_WINDOW_STEPS`` steps' wall times (a Theil–Sen slope, never below zero) and counts only
when a Mann–Kendall test over those medians says the step time rises: a sum over hundreds of
thousands of steps to come turns any noise read as a trend into days (a tiny leak against
the host's RAM on a loaded machine read "23 days" for 1.4 hours). Robust to a pause or one slow
step, flat where the step time is. The trend is carried ahead as many steps as have been timed
(at least the trend's window), the step time then held: a slope seen over 9,000 steps said 14 h
for 367k steps to come where RSS's own rate said ~1 h. Pure: no torch, no clock of its own.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from probes.tools.stats import theil_sen_slope

TREE_COUNTER = "host RSS + workers' USS"  # the trainer and its DataLoader workers, on the host
FILL_WINDOW_STEPS = 32  # steps the guard's fill rate is fitted over (RSS grows in chunks)
# The leak banner's ETA: the rate since the leak began, over up to this many steps, fitted to
# FILL_FIT_POINTS points spread evenly over them. A 32-step fit of RSS, which grows in chunks of
# MiBs every few steps, read 6 -> 37 -> 11 min within a minute (issue 38): points further
# apart than the chunks see the staircase as the line it is.
LEAK_FILL_WINDOW_STEPS = 512
FILL_FIT_POINTS = 32
TREND_WINDOW_STEPS = 512  # steps the step time's trend is measured over
TREND_MIN_STEPS = 64  # fewer, and the step time is taken as flat
TREND_BLOCK_STEPS = 8  # the trend is fitted to medians of this many steps: one slow step moves none
TREND_MIN_Z = 3.0  # Mann–Kendall z the block medians must reach (noise: ~1 in 700 reads)
TREND_REFIT_STEPS = 16  # the trend is refitted after this many new steps (~1 ms a fit)


@dataclass(frozen=True)
class FillForecast:
    """When ``counter`` reaches ``limit_name`` at the rate it grows now."""

    counter: str  # what fills: "host RSS", "device reserved", "device used (driver)"
    limit_name: str  # "--max-memory", "host RAM available", "device total"
    value_bytes: int
    room_bytes: int  # what is left before the limit
    bytes_per_step: float  # the counter's own growth, times the ranks sharing the room
    steps_to_full: int | None  # None while it does not grow
    seconds_to_full: float | None  # None without a step time


def fill_forecast(counter: str, limit_name: str, value_bytes: int, room_bytes: int,
                  bytes_per_step: float, seconds_per_step: float | None,
                  sharers: int = 1, step_time_growth_s: float = 0.0,
                  trend_steps: int | None = None) -> FillForecast:
    """The one formula: room left / (rate × sharers) steps, each taking the step's wall time
    now plus ``step_time_growth_s`` more per step to come (the sum of that arithmetic series)
    for the next ``trend_steps`` steps (all of them when None), and the step time reached
    then for the rest: a trend is not carried further ahead than it has been seen."""
    rate = bytes_per_step * max(1, sharers)
    room = max(0, int(room_bytes))
    steps = int(room / rate) if rate > 0 else None
    seconds = None
    if steps is not None and seconds_per_step:
        growth = max(0.0, step_time_growth_s)
        ahead = steps if trend_steps is None else min(steps, max(0, trend_steps))
        seconds = round(steps * seconds_per_step + growth * ahead * (ahead + 1) / 2
                        + growth * ahead * (steps - ahead), 1)
    return FillForecast(counter, limit_name, int(value_bytes), room, rate, steps, seconds)


def step_time_growth(step_times: list[tuple[int, float]]) -> float:
    """Seconds a step's wall time grows per step, from ``(step, seconds)`` points: the Theil–Sen
    slope of their TREND_BLOCK_STEPS-step blocks' medians, when a Mann–Kendall test over those
    medians reaches TREND_MIN_Z; 0.0 with fewer than TREND_MIN_STEPS points, or a step time
    that does not rise beyond its noise."""
    if len(step_times) < TREND_MIN_STEPS:
        return 0.0
    size = TREND_BLOCK_STEPS
    points = step_times[len(step_times) % size:]  # whole blocks, the newest kept
    xs, ys = [], []
    for k in range(0, len(points), size):
        block = points[k:k + size]
        xs.append(statistics.median(s for s, _ in block))
        ys.append(statistics.median(t for _, t in block))
    n = len(xs)
    sign_sum = sum((ys[j] > ys[i]) - (ys[j] < ys[i]) for i in range(n) for j in range(i + 1, n))
    z = (sign_sum - 1) / math.sqrt(n * (n - 1) * (2 * n + 5) / 18)  # ties ignored: fewer rises
    if z < TREND_MIN_Z:
        return 0.0
    return max(0.0, theil_sen_slope(xs, ys))


def filling_counter(device_type: str, limit_bytes: int | None, *, rss_bytes: int | None,
                    reserved_bytes: int | None, driver_used_bytes: int | None,
                    device_total_bytes: int | None, host_available: int | None,
                    workers_bytes: int | None = None) -> tuple[str, str, int, int] | None:
    """(counter, limit name, value, room) of the counter that fills the limit; None when
    the value or the limit cannot be read. ``workers_bytes``: the trainer's child processes'
    private bytes (USS, probes/counters/workers.py), added to RSS on the host: the pages they
    share with the trainer are in its RSS already, so nothing is counted twice (pages only
    workers share among themselves are left out: a lower bound, never a phantom)."""
    if device_type == "cuda":
        if limit_bytes is not None:
            return (None if reserved_bytes is None else
                    ("device reserved", "--max-memory", reserved_bytes,
                     limit_bytes - reserved_bytes))
        used, name = ((driver_used_bytes, "device used (driver)") if driver_used_bytes
                      else (reserved_bytes, "device reserved"))
        if used is None or not device_total_bytes:
            return None
        return name, "device total", used, device_total_bytes - used
    if rss_bytes is None:
        return None
    name = "host RSS"
    if workers_bytes:  # the trainer's children fill the same RAM: what only they hold
        name, rss_bytes = TREE_COUNTER, rss_bytes + workers_bytes
    if limit_bytes is not None:
        return name, "--max-memory", rss_bytes, limit_bytes - rss_bytes
    if host_available is None:
        return None
    return name, "host RAM available", rss_bytes, host_available


class FillTracker:
    """The trailing series of the filling counter, with the steps' wall times: ``feed`` one
    point per step, ``mark_gap`` across a pause or an ignored step, ``forecast`` any time."""

    def __init__(self, window_steps: int = FILL_WINDOW_STEPS,
                 fit_points: int | None = None) -> None:
        if window_steps < 2:
            raise ValueError(f"window_steps must be at least 2, got {window_steps}")
        if fit_points is not None and fit_points < 3:
            raise ValueError(f"fit_points must be at least 3, got {fit_points}")
        self._points: deque[tuple[int, float, int]] = deque(maxlen=window_steps)
        self._per_step_s: deque[float] = deque(maxlen=min(window_steps, FILL_WINDOW_STEPS))
        self.fit_points = fit_points  # None: fit every point (the guard: the latest rate)
        self._step_times: deque[tuple[int, float]] = deque(maxlen=TREND_WINDOW_STEPS)
        self._growth_s = 0.0  # step_time_growth of _step_times, refitted every few steps
        self._since_fit = TREND_REFIT_STEPS  # new step times since that fit
        self._timed_steps = 0  # step times seen in all: how far ahead a trend is carried

    def mark_gap(self) -> None:
        """The next point is not comparable with the last (its delta is not a step's growth)."""
        self._points.clear()

    def feed(self, step: int, time_s: float, value_bytes: int | None) -> None:
        if value_bytes is None:
            self.mark_gap()
            return
        if self._points and step <= self._points[-1][0]:
            self.mark_gap()
        if self._points:
            last_step, last_t, _ = self._points[-1]
            per_step = (time_s - last_t) / (step - last_step)
            self._per_step_s.append(per_step)
            self._step_times.append((step, per_step))
            self._since_fit += 1
            self._timed_steps += 1
        self._points.append((step, time_s, int(value_bytes)))

    def bytes_per_step(self, since_step: int | None = None) -> float | None:
        """Theil–Sen slope of the window (from ``since_step`` on, where growth began, when
        that leaves three points: flat steps before a leak are not its rate); None with fewer
        than three points."""
        points = list(self._points)
        if since_step is not None:
            grown = [p for p in points if p[0] >= since_step - 1]
            points = grown if len(grown) >= 3 else points
        if len(points) < 3:
            return None
        k = self.fit_points
        if k is not None and len(points) > k:  # evenly spread, the newest kept
            last = len(points) - 1
            points = [points[round(last - i * last / (k - 1))] for i in range(k - 1, -1, -1)]
        return theil_sen_slope([p[0] for p in points], [p[2] for p in points])

    @property
    def seconds_per_step(self) -> float | None:
        return statistics.median(self._per_step_s) if self._per_step_s else None

    def forecast(self, where: tuple[str, str, int, int] | None, sharers: int = 1,
                 since_step: int | None = None,
                 floor_bytes_per_step: float = 0.0) -> FillForecast | None:
        """``where`` is ``filling_counter``'s answer for the latest step. ``floor_bytes_per_step``
        is a rate the counter cannot grow slower than (the leaking heap inside RSS, allocated
        inside reserved): RSS grows in chunks, so just after an alert its own fit may still
        read zero."""
        fitted = self.bytes_per_step(since_step)
        rate = max(fitted or 0.0, floor_bytes_per_step)
        if where is None or (fitted is None and not floor_bytes_per_step):
            return None
        counter, limit_name, value, room = where
        return fill_forecast(counter, limit_name, value, room, rate, self.seconds_per_step,
                             sharers, self.step_time_growth_s,
                             trend_steps=max(self._timed_steps, TREND_WINDOW_STEPS))

    @property
    def step_time_growth_s(self) -> float:
        """step_time_growth of the trailing step times, refitted every TREND_REFIT_STEPS new
        steps (the guard asks at every step)."""
        if self._since_fit >= TREND_REFIT_STEPS:
            self._growth_s = step_time_growth(list(self._step_times))
            self._since_fit = 0
        return self._growth_s
