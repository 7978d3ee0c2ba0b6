"""How the run ended (run_finished's reason) and the errors it recorded, listed at the end of
report.md."""

from __future__ import annotations

from typing import Any

from probes import records as R
from probes.analysis.report.context import ReportContext
from probes.records import incomplete


def build(ctx: ReportContext) -> dict[str, Any]:
    errors = [{"step": e.get("step"), "type": e.get("error_type"), "message": e.get("message")}
              for e in ctx.metrics.named(R.ERROR)]
    return {"status": {"reason": ctx.metrics.end, "errors": errors}}


def render(section: dict[str, Any], report: dict[str, Any]) -> list[str]:
    errors = section["status"]["errors"]
    if not errors:
        return []
    return ["## Errors", ""] + [f"- step {e['step']}: " + (
        incomplete(R.ERROR, {"error_type": e["type"], "message": e["message"]})
        or f"{e['type']}: {e['message']}") for e in errors] + [""]
