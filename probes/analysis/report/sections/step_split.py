"""The report's "Where the step went": the median and p95 of each phase of the measured steps
(data wait, forward, backward, optimizer, other; probes/analysis/step_split.py), each phase's
share of the median cycle, and why a phase is missing (the run predates the split, no hook
fired). On CUDA the phases are device time (CUDA events), on CPU host time.
"""

from __future__ import annotations

from typing import Any

from probes.analysis.measured import measured_steps
from probes.analysis.report.context import ReportContext, warmup_steps
from probes.analysis.step_split import PREDATES, phase_stats, why_no_split
from probes.records import SPLIT_LABELS
from probes.tools.tables import markdown_table
from probes.tools.units import format_ms, format_pct


def build(ctx: ReportContext) -> dict[str, Any]:
    rows, _over = measured_steps(ctx.steps, warmup_steps(ctx.config))
    if not rows:
        return {"step_split": None}
    device = str(ctx.started.get("device") or rows[-1].get("device") or "")
    return {"step_split": {
        "steps": len(rows), "clock": "device time (CUDA events)" if device.startswith("cuda")
        else "host time", "phases": phase_stats(rows), "missing": why_no_split(rows)}}


def render(section: dict[str, Any], report: dict[str, Any]) -> list[str]:
    sec = section["step_split"]
    if sec is None:
        return []
    md = ["## Where the step went", ""]
    if set(sec["missing"].values()) == {PREDATES}:
        return md + [f"- n/a: {PREDATES}.", ""]
    rows = [[SPLIT_LABELS[name], format_ms(p["median_ms"]), format_ms(p["p95_ms"]),
             format_pct(p["share"]), p["n"]] for name, p in sec["phases"].items()]
    md += [markdown_table(["phase", "median", "p95", "share of the cycle", "steps"], rows,
                          right={1, 2, 3, 4}), ""]
    md.append(f"- Over {sec['steps']} measured steps, {sec['clock']}; data wait is the loop's "
              "time between two steps (loader, logging), the others lie inside the step.")
    for name, why in sec["missing"].items():
        md.append(f"- {SPLIT_LABELS[name]}: {why}.")
    return md + [""]
