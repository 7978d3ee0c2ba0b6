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
    forecasts = [{k: e.get(k) for k in ("step", "counter", "fill_counter", "limit_name",
                                        "fill_bytes_per_step", "steps_to_full",
                                        "seconds_to_full")}
                 for e in ctx.metrics.named(R.LEAK_FORECAST)]
    alert = next(iter(ctx.metrics.named(R.LEAK_SUSPECTED)), None)
    guard = next(iter(ctx.metrics.named(R.MEMORY_GUARD)), None)
    after = (guard["time_s"] - alert["time_s"] if alert and guard and isinstance(
        alert.get("time_s"), (int, float)) and isinstance(guard.get("time_s"), (int, float))
        else None)
    return {"leaks": [shown_fields(e) for e in ctx.metrics.named(*LEAK_EVENTS)],
            "leak_timing": {"forecasts": forecasts, "guard_after_alert_s": after}}


def forecast_line(forecasts: list[dict[str, Any]], most: int = 6) -> str | None:
    """The time to full as it was recomputed while an alert was open, first to last."""
    if not forecasts:
        return None
    picked = forecasts if len(forecasts) <= most else (
        [forecasts[round(i * (len(forecasts) - 1) / (most - 1))] for i in range(most)])
    last = forecasts[-1]
    what = R.fill_text(last) or "n/a"
    steps = ", ".join(f"step {f.get('step')}: {format_duration(f.get('seconds_to_full'))}"
                      for f in picked)
    return (f"Time to full, recomputed every few seconds while the alert was open ({len(forecasts)}"
            f" times): {steps}. Last: {what} (probes/counters/fill.py: the counter that fills "
            "the limit, at its own rate since the leak began, over up to 512 steps). The table's "
            "\"full in\" is each event's own forecast (for leak_suspected: at the alert); the "
            "dashboard's banner shows the latest.")


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
    line = forecast_line((section.get("leak_timing") or {}).get("forecasts") or [])
    return md + [markdown_table(["step", "event", "counter / kind", "growth", "since",
                                 "full in (then)"],
                                rows, right={0, 3, 4, 5}), ""] + hints + (
        ["", line] if line else []) + [""]
