"""Time to full: when the counter that actually fills the limit reaches it, at its own rate.

One rule for the leak banner (probes/instruments/leak.py) and the memory guard
(probes/monitor/guard.py), so the two never tell different stories. The counter that fills is
not the one that leaks: a retained graph grows the heap by 150 KiB/step while RSS, what the
kernel and ``--max-memory`` count, grows by MiBs. So the forecast follows

- on CPU: host RSS against ``--max-memory``; without one, against the RAM still available to
  the whole host (MemAvailable), its rate times the ranks on this host (they grow together);
- on CUDA: reserved against ``--max-memory``; without one, the driver's used (every process on
  the device) against the device's total.

Its rate is a Theil–Sen slope over the last ``window_steps`` comparable steps, refitted at every
call, so the ETA follows the rate as it changes. The time left sums the steps still to come at a
step time that keeps its trend: a leak slows the steps it leaks in (a retained graph's objects
make each garbage collection longer: memtop's graph demo went from 55 to 145 ms a step on its way
to 10 GiB), so the last steps' median alone said "full" ~30% too early (benchmarks/RESULTS.md,
issue 30). The trend is the difference of two medians (the older and the newer half of the last
``TREND_WINDOW_STEPS`` steps' wall times), never below zero: robust to a pause or one slow step,
and flat where the step time is. Pure: no torch, no clock of its own.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from probes.tools.stats import theil_sen_slope

FILL_WINDOW_STEPS = 32  # steps the fill rate is fitted over (RSS grows in chunks)
TREND_WINDOW_STEPS = 512  # steps the step time's trend is measured over
TREND_MIN_STEPS = 64  # fewer, and the step time is taken as flat


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
                  sharers: int = 1, step_time_growth_s: float = 0.0) -> FillForecast:
    """The one formula: room left / (rate × sharers) steps, each taking the step's wall time
    now plus ``step_time_growth_s`` more per step to come (the sum of that arithmetic series)."""
    rate = bytes_per_step * max(1, sharers)
    room = max(0, int(room_bytes))
    steps = int(room / rate) if rate > 0 else None
    seconds = None
    if steps is not None and seconds_per_step:
        growth = max(0.0, step_time_growth_s)
        seconds = round(steps * seconds_per_step + growth * steps * (steps + 1) / 2, 1)
    return FillForecast(counter, limit_name, int(value_bytes), room, rate, steps, seconds)


def step_time_growth(step_times: list[tuple[int, float]]) -> float:
    """Seconds a step's wall time grows per step: the median of the newer half of ``(step,
    seconds)`` less that of the older half, over the steps between the halves' middles; 0.0
    with fewer than TREND_MIN_STEPS points or a step time that does not grow."""
    if len(step_times) < TREND_MIN_STEPS:
        return 0.0
    half = len(step_times) // 2
    older, newer = step_times[:half], step_times[-half:]
    distance = statistics.median(s for s, _ in newer) - statistics.median(s for s, _ in older)
    if distance <= 0:
        return 0.0
    grown = statistics.median(t for _, t in newer) - statistics.median(t for _, t in older)
    return max(0.0, grown / distance)


def filling_counter(device_type: str, limit_bytes: int | None, *, rss_bytes: int | None,
                    reserved_bytes: int | None, driver_used_bytes: int | None,
                    device_total_bytes: int | None, host_available: int | None
                    ) -> tuple[str, str, int, int] | None:
    """(counter, limit name, value, room) of the counter that fills the limit; None when
    the value or the limit cannot be read."""
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
    if limit_bytes is not None:
        return "host RSS", "--max-memory", rss_bytes, limit_bytes - rss_bytes
    if host_available is None:
        return None
    return "host RSS", "host RAM available", rss_bytes, host_available


class FillTracker:
    """The trailing series of the filling counter, with the steps' wall times: ``feed`` one
    point per step, ``mark_gap`` across a pause or an ignored step, ``forecast`` any time."""

    def __init__(self, window_steps: int = FILL_WINDOW_STEPS) -> None:
        if window_steps < 2:
            raise ValueError(f"window_steps must be at least 2, got {window_steps}")
        self._points: deque[tuple[int, float, int]] = deque(maxlen=window_steps)
        self._per_step_s: deque[float] = deque(maxlen=window_steps)
        self._step_times: deque[tuple[int, float]] = deque(maxlen=TREND_WINDOW_STEPS)

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
                             sharers, step_time_growth(list(self._step_times)))
