"""Which step rows a statistic may use: the one rule every report, comparison and baseline
follows (docs/ARCHITECTURE.md, "Records"): steps after warmup, and not the steps memtop's own
diagnosis disturbed (probes/records/disturbed.py: a profiler window's traced steps, the steps
while its table was computed and those settling after it, a culprit look's steps: they run
slower and allocate more). Rows read through probes/runfolder/ are marked, old folders too."""

from __future__ import annotations

import math
from typing import Any

from probes.records import counts_toward_peak, is_disturbed
from probes.records.disturbed import disturbed_counts, left_out_text
from probes.tools.stats import percentile

LOSS_WINDOW = 10  # steps in a "recent loss": the report's, and compare's loss agreement


def measured_steps(steps: list[dict[str, Any]], warmup: int) -> tuple[list[dict], str]:
    """Timing stats leave out the warmup and the disturbed steps (records/disturbed.py); the
    text says which were left out, and why."""
    after = [r for r in steps if r["step"] > warmup]
    clean = [r for r in after if not is_disturbed(r)]
    left_out = disturbed_counts(after) if len(clean) < len(after) else {}
    if clean and left_out:
        return clean, (f"steps after warmup ({warmup}), {sum(left_out.values())} disturbed by "
                       f"memtop's own diagnosis left out ({left_out_text(left_out)})")
    if clean:
        return clean, f"steps after warmup ({warmup})"
    if after:
        return after, (f"steps after warmup ({warmup}); all of them were disturbed by memtop's "
                       "own diagnosis (profiler, culprit look)")
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
    row still carries the warm-up's peak) and not disturbed by memtop's own diagnosis
    (records.counts_toward_peak); all rows when none are left."""
    after_reset = [r for r in steps if r["step"] > warmup] or steps
    return [r for r in after_reset if counts_toward_peak(r)] or after_reset
