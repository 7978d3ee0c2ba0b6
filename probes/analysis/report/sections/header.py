"""The report's head: which run, when, from which rows, and whether the run is complete (a
killed run is reported from the rows that exist, with the reasons it is incomplete)."""

from __future__ import annotations

import datetime as _dt
from typing import Any

from probes.analysis.report.context import ReportContext

REPORT_VERSION = 1


def incomplete_reasons(ctx: ReportContext) -> list[str]:
    """Why the rows may not cover the whole run; [] for a run that ended and was fully read."""
    m = ctx.metrics
    name = m.path.name
    reasons = []
    if m.finished is None:
        reasons.append(f"no run_finished row in {name}: the run was killed, crashed "
                       "hard, or is still going")
    if m.truncated:
        reasons.append(f"the last line of {name} is cut short (killed while writing)")
    bad_inside = m.bad - (1 if m.truncated and m.bad else 0)
    if bad_inside > 0:
        reasons.append(f"{bad_inside} bad line(s) in {name} were skipped: not JSON, or values "
                       f"that break the schema (wrong type, negative, not finite); first: "
                       f"{m.first_bad}")
    missing = [rank for rank, f in ctx.ranks.items() if f.end is None and rank]
    if missing:
        reasons.append("no run_finished row for rank " + ", ".join(map(str, missing)))
    return reasons


def build(ctx: ReportContext) -> dict[str, Any]:
    reasons = incomplete_reasons(ctx)
    return {
        "report_version": REPORT_VERSION,
        "run_dir": str(ctx.run_dir),
        "generated_at": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "complete": not reasons, "incomplete_reasons": reasons,
        "rows": {"steps": len(ctx.steps), "events": len(ctx.events),
                 "unreadable": ctx.metrics.bad, "first_bad": ctx.metrics.first_bad},
    }


def build_train(ctx: ReportContext) -> dict[str, Any]:
    """A training run's head also names the metrics file it read (rank 0's of several)."""
    return {**build(ctx), "metrics_file": ctx.metrics.path.name}


def _name(report: dict[str, Any]) -> str:
    return report["run_dir"].rstrip("/").split("/")[-1]


def render_train(section: dict[str, Any], report: dict[str, Any]) -> list[str]:
    md = [f"# memtop report: {_name(report)}", ""]
    if not section["complete"]:
        md += ["> **Incomplete run.** " + " ".join(f"{x[0].upper()}{x[1:]}."
                                                   for x in section["incomplete_reasons"]), ""]
    source = f"`{section.get('metrics_file') or 'metrics.jsonl'}`"
    if report.get("ranks"):
        source += f" (rank 0 of {report['ranks']['count']}; every rank under Ranks)"
    rows = section["rows"]
    return md + [f"Generated {section['generated_at']} from {source} ({rows['steps']} step "
                 f"rows, {rows['events']} events).", ""]


def render_infer(section: dict[str, Any], report: dict[str, Any]) -> list[str]:
    md = [f"# memtop inference report: {_name(report)}", ""]
    if not section["complete"]:
        md += ["> **Incomplete run.** " + " ".join(section["incomplete_reasons"]), ""]
    return md
