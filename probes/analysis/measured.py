"""Which step rows a statistic may use: the one rule every report, comparison and baseline
follows (docs/ARCHITECTURE.md, "Records"): steps after warmup, and not the steps a profiler
window traced (its wait, warmup and active steps run slower and allocate more)."""

from __future__ import annotations

from typing import Any

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
