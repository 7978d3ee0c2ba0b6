"""Leak and memory events: what the leak detector suspected and cleared, the leak demo's start
and stop, and the memory guard stopping the run, each with its growth and hint."""

from __future__ import annotations

from typing import Any

from probes import records as R
from probes.analysis.report.context import ReportContext, shown_fields
from probes.records import incomplete
from probes.tools.tables import markdown_table
from probes.tools.units import format_bytes, format_duration

LEAK_EVENTS = (R.LEAK_SUSPECTED, R.LEAK_CLEARED, R.LEAK_DEMO_STARTED, R.LEAK_DEMO_STOPPED,
               R.MEMORY_GUARD)


def build(ctx: ReportContext) -> dict[str, Any]:
    return {"leaks": [shown_fields(e) for e in ctx.metrics.named(*LEAK_EVENTS)]}


def render(section: dict[str, Any], report: dict[str, Any]) -> list[str]:
    md = ["## Leak and memory events", ""]
    if not section["leaks"]:
        return md + ["None recorded.", ""]
    rows, hints = [], []
    for e in section["leaks"]:
        per_step = e.get("bytes_per_step") or e.get("growth_bytes_per_step")
        what = incomplete(str(e.get("event")), e) or e.get("counter") or e.get("kind")
        rows.append([e.get("step"), e.get("event"), what,
                     format_bytes(per_step, na="") + ("/step" if per_step else ""),
                     e.get("since_step", ""), format_duration(e.get("seconds_to_full"))])
        if e.get("hint"):
            hints.append(f"- step {e.get('step')} ({e.get('event')}): {e['hint']}")
    return md + [markdown_table(["step", "event", "counter / kind", "growth", "since", "full in"],
                                rows, right={0, 3, 4, 5}), ""] + hints + [""]
