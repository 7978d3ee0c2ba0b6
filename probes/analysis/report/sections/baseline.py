"""The run against the baseline it was started with (`--baseline RUN`, tutorial exercise 8):
the full comparison `memtop compare` makes, worded the same way."""

from __future__ import annotations

from typing import Any

from probes.analysis.compare.compare import compare_runs
from probes.analysis.compare.text import comparison_lines
from probes.analysis.report.context import ReportContext
from probes.runfolder import RunFolderError


def build(ctx: ReportContext) -> dict[str, Any] | None:
    """compare_runs with --force: a different model is reported with its warning, not refused,
    since the run already happened. None when the run had no baseline."""
    baseline = ctx.config.get("baseline")
    if not isinstance(baseline, str) or not baseline:
        return None
    try:
        result = compare_runs([baseline, ctx.run_dir], force=True)
    except (RunFolderError, OSError, ValueError) as exc:
        return {"baseline": {"run": baseline, "error": str(exc)}}
    return {"baseline": {"run": baseline, "baseline": result["baseline"],
                         "comparison": result["comparisons"][0],
                         "noise_rule": result["noise_rule"]}}


def render(section: dict[str, Any], report: dict[str, Any]) -> list[str]:
    b = section["baseline"]
    if b.get("error"):
        return ["## Against the baseline", "",
                f"Baseline {b['run']}: not compared ({b['error']})", ""]
    lines = comparison_lines(b["comparison"], b["run"])
    lines[0] = f"## Against the baseline {b['run']}"
    return lines + [f"Noise rule: {b['noise_rule']}", ""]
