"""`--max-memory` / ``max_memory_bytes``: stop cleanly before a watched counter passes the
limit, instead of letting the OS or the CUDA allocator kill the run mid-step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from probes import records as R
from probes.counters.fill import TREE_COUNTER, FillForecast, FillTracker, filling_counter
from probes.counters.memory import MemoryReading, guard_trip
from probes.tools.units import format_bytes


class MemoryGuard:
    """Checked after every step's reading, and once before the first step (a limit the run is
    already over stops it before it trains). On CUDA it watches this step's peak (an OOM
    happens mid-step) and reserved (the cache must grow to allocate); host RSS on CPU, plus
    the DataLoader workers' private bytes where the loop has workers (--max-memory on CUDA is
    the device's: workers live in host RAM and are not counted against it).

    Its time to full is the leak banner's (probes/counters/fill.py): the same counter (reserved
    or RSS against the limit), the same fitted rate; it stops when the last step's growth or
    that rate would pass the limit within one step.

    During the warm-up steps (``warmup_steps``) a step's growth is set-up, not a rate: the
    first step makes the optimizer's state, its first activations and the kernels' caches at
    once (+149 MiB on memtop's default CPU run, whose later steps hold still), so carried one
    step ahead it stopped runs whose peak fits (`memtop fit`'s largest B, README "Will it
    fit?"). Then only a counter already over the limit stops the run."""

    def __init__(self, limit_bytes: int | None, device_type: str,
                 emit: Callable[[str, int, dict[str, Any]], Any],
                 stop: Callable[[str], None], warmup_steps: int = 0) -> None:
        self.limit_bytes = limit_bytes
        self.device_type = device_type
        self.warmup_steps = warmup_steps
        self._emit, self._stop = emit, stop
        self._prev: dict[str, int | None] | None = None
        self.fill = FillTracker()
        self.forecast: FillForecast | None = None  # the latest, None without a limit

    def check(self, step: int, reading: MemoryReading, time_s: float | None = None,
              workers_bytes: int | None = None) -> bool:
        """True when it stopped the run (step 0: before the first step); ``time_s`` (the
        run's clock at the end of the step) times the forecast; ``workers_bytes``: the
        DataLoader workers' private bytes at the sampler's latest reading, counted with host
        RSS on CPU (the box fills with both; probes/counters/fill.py TREE_COUNTER)."""
        if self.device_type == "cuda":
            watched = {"device step peak": reading.step_peak_allocated_bytes,
                       "device reserved": reading.reserved_bytes}
        elif workers_bytes and reading.host_rss_bytes is not None:
            watched = {TREE_COUNTER: reading.host_rss_bytes + workers_bytes}
        else:
            watched = {"host RSS": reading.host_rss_bytes}
        prev, self._prev = self._prev, watched
        if self.limit_bytes is None:
            return False
        where = filling_counter(self.device_type, self.limit_bytes,
                                rss_bytes=reading.host_rss_bytes,
                                reserved_bytes=reading.reserved_bytes, driver_used_bytes=None,
                                device_total_bytes=None, host_available=None,
                                workers_bytes=workers_bytes if self.device_type != "cuda"
                                else None)
        if step > 0 and time_s is not None:
            self.fill.feed(step, time_s, where[2] if where else None)
        self.forecast = self.fill.forecast(where)
        settled = step > self.warmup_steps
        trip = guard_trip(watched, prev if settled else None, self.limit_bytes)
        fc = self.forecast
        if trip is None and settled and fc is not None and fc.steps_to_full == 0:
            trip = (fc.counter, fc.value_bytes, int(fc.bytes_per_step))  # the fitted rate
        if trip is None:
            return False
        counter, value, growth = trip
        limit = self.limit_bytes
        fitted = fc.bytes_per_step if fc is not None and fc.counter == counter else None
        self._emit(R.MEMORY_GUARD, step, {
            "counter": counter, "watched_bytes": value, "limit_bytes": limit,
            "growth_bytes_per_step": growth, "passed": value > limit,
            "fill_bytes_per_step": fitted,
            "steps_to_full": fc.steps_to_full if fc else None,
            "seconds_to_full": fc.seconds_to_full if fc else None})
        self._stop(guard_reason(step, counter, value, limit, growth, fitted))
        return True


def guard_reason(step: int, counter: str, value: int, limit: int, growth: int,
                 fitted: float | None) -> str:
    """run_finished's reason for a guard stop. "passed" when this step's jump carried the
    counter over the limit ("would pass ... (0 B left)" read wrong, issue 44), "is over" when
    it was over before (during warm-up only that stops a run); the rate is the forecast's
    fitted one beside this step's own jump where the two differ, so it matches the leak
    alert's rate instead of one chunk of RSS."""
    if step == 0:
        return (f"memory guard: {counter} is {format_bytes(value)} before the first step, "
                f"already over --max-memory {format_bytes(limit)}; nothing was trained")
    rate = f"+{format_bytes(fitted)}/step fitted" if fitted else None
    jump = f"+{format_bytes(growth)} this step"
    if rate is None or format_bytes(fitted) == format_bytes(growth):
        rate = f"+{format_bytes(growth)}/step" if rate is None else rate
        both = rate
    else:
        both = f"{rate}, {jump}"
    if value > limit and 0 < growth and value - growth <= limit:
        return (f"memory guard: {counter} at {format_bytes(value)} passed --max-memory "
                f"{format_bytes(limit)} this step ({format_bytes(value - limit)} over; {both})")
    if value > limit:  # over before this step (a warm-up step's one-off growth carried it)
        rates = f"; {rate}" if fitted else ""
        return (f"memory guard: {counter} at {format_bytes(value)} is over --max-memory "
                f"{format_bytes(limit)} ({format_bytes(value - limit)} over{rates})")
    # the growth and the room left: rounded alone, value and limit often read the same
    return (f"memory guard: {counter} at {format_bytes(value)} ({both}) would pass "
            f"--max-memory {format_bytes(limit)} next step ({format_bytes(limit - value)} left)")
