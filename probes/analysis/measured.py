"""Which step rows a statistic may use: the one rule every report, comparison and baseline
follows (docs/ARCHITECTURE.md, "Records"): steps after warmup, and not the steps a profiler
window traced (its wait, warmup and active steps run slower and allocate more)."""

from __future__ import annotations

import math
from typing import Any

from probes.records import counts_toward_peak
from probes.tools.stats import percentile

LOSS_WINDOW = 10  # steps in a "recent loss": the report's, and compare's loss agreement


def measured_steps(steps: list[dict[str, Any]], warmup: int) -> tuple[list[dict], str]:
    """Timing stats leave out the warmup and only the steps the profiler traced (its wait,
    warmup and active steps: ``profiling``); the table's analysis afterwards runs in a child
    process and its steps count."""
    after = [r for r in steps if r["step"] > warmup]
    clean = [r for r in after if not r.get("profiling")]
    traced = len(after) - len(clean)
    if clean and traced:
        return clean, (f"steps after warmup ({warmup}), the {traced} steps the profiler traced "
                       "(wait, warmup, active) left out")
    if clean:
        return clean, f"steps after warmup ({warmup})"
    if after:
        return after, f"steps after warmup ({warmup}); all of them were traced by the profiler"
    return steps, "all steps (none after warmup were recorded)"


# (field of a step row, its unit): a run's throughput is the first of these its rows carry
RATE_FIELDS = (("tokens_per_s", "tok/s"), ("samples_per_s", "samples/s"))


def throughput_p50(steps: list[dict[str, Any]], warmup: int) -> tuple[float | None, str]:
    """The one throughput figure of a run, used by every command (the report, `memtop runs`,
    a rank's part of "together"): the median over measured_steps of tokens/s, else samples/s,
    else steps/s. Never the last step's: a single step swings ±10% on a shared machine."""
    rows, _ = measured_steps(steps, warmup)
    for field, unit in RATE_FIELDS:
        values = [v for v in (r.get(field) for r in rows)
                  if isinstance(v, (int, float)) and math.isfinite(v) and v > 0]
        if values:
            return percentile(values, 50), unit
    rates = [1000.0 / v for v in (r.get("step_ms") for r in rows)
             if isinstance(v, (int, float)) and math.isfinite(v) and v > 0]
    return (percentile(rates, 50) if rates else None), "steps/s"


def peak_steps(steps: list[dict[str, Any]], warmup: int) -> list[dict[str, Any]]:
    """The rows a run's peak is taken over, for the report and compare alike: after the peak's
    reset (it runs once step ``warmup`` has been read — probes/monitor/monitor.py — so that
    row still carries the warm-up's peak) and not traced by the profiler
    (records.counts_toward_peak); all rows when none are left."""
    after_reset = [r for r in steps if r["step"] > warmup] or steps
    return [r for r in after_reset if counts_toward_peak(r)] or after_reset
