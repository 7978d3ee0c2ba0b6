"""The DataLoader workers' series inside the leak watch (leakwatch.py): their summed private
bytes (USS) as one more counter, fed one point per sampler reading (probes/counters/workers.py),
with what an alert on it says: how many workers, whether the trainer itself is flat beside them,
which pattern their growth matches and its fix, and when the box (the trainer plus its workers)
is full.

The workers' memory is not the trainer's: it is fed on warmup steps and on the steps memtop's
own diagnosis disturbed (neither touches another process), and a new set of workers (a start,
an end, a new epoch's workers without persistent_workers) starts a new series after
``settle_readings`` readings (the one that shows the change included), so a worker's start-up
(imports, its first batches) is not taken for growth. The points are sparse in steps where
steps are faster than the sampler (one a second): the detector fits bytes per step over the
steps between them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Any

from probes.counters.fill import FillForecast, FillTracker, filling_counter
from probes.counters.workers import WorkersReading
from probes.instruments.leak import LeakAlert, LeakCleared, LeakDetector, LeakDetectorConfig
from probes.instruments.leakcause import workers_cause
from probes.records import WORKERS_COUNTER, StepSample
from probes.tools.stats import theil_sen_slope

# Fewer points than the trainer's detector needs: a point is a reading (about a second), not a
# step, so 3 rising deltas after 3 points already span seconds of sustained growth. A faster
# rate and more growth than the trainer's (16 KiB/step, 512 KiB): a healthy forked worker's own
# pages grow by 3-8 MiB over its first batches, then by 10-50 KiB a step for a few hundred
# steps, slowing down (copy-on-write of the trainer's pages its reads touch, pymalloc arenas);
# measured on tests/integration/test_workers.py's loops (issue 43). A delta counts as rising
# from half the rate (32 KiB/step), above that slow tail.
WORKERS_CONFIG = LeakDetectorConfig(min_steps=3, window_steps=12, baseline_points=3,
                                    noise_steps=16, high_water_steps=32,
                                    min_rate_bytes=64 * 1024,
                                    min_growth_bytes=2 * 1024 * 1024)
GROWTH_PER_WORKER = 1024 * 1024  # the window's growth must also reach this times the workers
# readings that start no series when the set of workers changed: the one that shows the change
# and the 2 after it (a new worker's first batches: 3-8 MiB of collate buffers and arenas)
SETTLE_READINGS = 3
TRAINER_POINTS = 16  # the trainer's own recent readings, to say whether it is flat beside them


class WorkersSeries:
    """The workers' detector and what an alert on it needs; ``feed`` one fresh reading."""

    def __init__(self, config: LeakDetectorConfig | None = None,
                 settle_readings: int = SETTLE_READINGS) -> None:
        self.config = config or WORKERS_CONFIG
        self.detector = LeakDetector(WORKERS_COUNTER, self.config)
        self.settle_readings = settle_readings
        self.fill = FillTracker()  # the trainer's RSS + the workers' USS, at each reading
        self.generation: int | None = None
        self.generation_step = 0  # the step at which the current set of workers was first seen
        self.latest: WorkersReading | None = None
        self._settle = 0
        self._trainer: deque[tuple[int, int]] = deque(maxlen=TRAINER_POINTS)

    def mark_gap(self) -> None:
        self.detector.mark_gap()
        self.fill.mark_gap()

    def trainer_point(self, step: int, value: int | None) -> None:
        """The trainer's own memory at a step it measured (heap or allocated)."""
        if value is not None:
            self._trainer.append((step, value))

    def feed(self, step: int, reading: WorkersReading,
             sample: StepSample) -> LeakAlert | LeakCleared | None:
        self.latest = reading
        if reading.generation != self.generation:
            self.generation, self.generation_step = reading.generation, step
            self._settle = self.settle_readings
            self.mark_gap()
            self.detector.config = replace(self.config, min_growth_bytes=max(
                self.config.min_growth_bytes, GROWTH_PER_WORKER * reading.workers))
        private = reading.private_bytes
        if not reading.workers or private is None:
            self.mark_gap()
            alert = self.detector.active
            if alert is not None and not reading.workers:  # they ended: their memory with them
                self.detector.active = None
                return LeakCleared(WORKERS_COUNTER, step, step, alert)
            return None
        if self._settle > 0:
            self._settle -= 1
            return None
        if sample.host_rss_bytes is not None:
            self.fill.feed(step, sample.time_s, sample.host_rss_bytes + private)
        return self.detector.feed(step, private)

    def trainer_rate(self, since_step: int | None = None) -> float | None:
        """The trainer's own bytes/step over its recent readings (Theil–Sen); None with fewer
        than three."""
        points = list(self._trainer)
        if since_step is not None:
            later = [p for p in points if p[0] >= since_step - 1]
            points = later if len(later) >= 3 else points
        if len(points) < 3:
            return None
        return theil_sen_slope([p[0] for p in points], [p[1] for p in points])

    def alert_fields(self, alert: LeakAlert, trainer_threshold: float,
                     trainer_alert: bool) -> dict[str, Any]:
        """The leak_suspected event's workers fields: how many, the trainer beside them, the
        pattern and its fix."""
        reading = self.latest
        n = reading.workers if reading is not None else None
        trainer = self.trainer_rate(alert.since_step)
        flat = None if trainer is None else (trainer < trainer_threshold and not trainer_alert)
        from_start = alert.since_step - self.generation_step <= self.settle_readings + 2
        cause, pattern, hint = workers_cause(alert.bytes_per_step, reading, from_start)
        return {"workers": n, "trainer_bytes_per_step": round(trainer) if trainer is not None
                else None, "trainer_flat": flat, "likely_cause": cause, "pattern": pattern,
                "hint": hint}

    def forecast(self, where_host: tuple[str, str, int, int] | None, sharers: int,
                 alert: dict[str, Any]) -> FillForecast | None:
        """When the host is full at the rate the trainer and its workers grow together."""
        return self.fill.forecast(where_host, sharers, alert.get("since_step"),
                                  float(alert.get("bytes_per_step") or 0.0))


def host_where(sample: StepSample, limit: int | None, host_available: int | None,
               ) -> tuple[str, str, int, int] | None:
    """The trainer's RSS plus its workers' USS against ``limit`` (CPU's --max-memory) or the
    RAM the host still has: what a workers' leak fills, on CPU and CUDA runs alike."""
    return filling_counter("cpu", limit, rss_bytes=sample.host_rss_bytes, reserved_bytes=None,
                           driver_used_bytes=None, device_total_bytes=None,
                           host_available=host_available,
                           workers_bytes=sample.workers_uss_bytes)
