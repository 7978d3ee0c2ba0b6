"""The profiler windows a run took: done ones with their top ops (the table the window's child
process computed, probes/traces/opstable.py), cancelled ones with the reason."""

from __future__ import annotations

from typing import Any

from probes import records as R
from probes.analysis.report.context import ReportContext
from probes.records import incomplete
from probes.records.phase_ops import ranges_text, split_ranges
from probes.tools.tables import markdown_table
from probes.tools.units import format_us

TOP_OPS = 5  # ops per window in the report


def op_time(op: dict[str, Any]) -> tuple[float, str]:
    """An op's self time in µs and which clock it is: the device's where it was measured."""
    dev = op.get("self_device_us")
    if isinstance(dev, (int, float)) and dev > 0:
        return float(dev), "self device"
    cpu = op.get("self_cpu_us")
    return (float(cpu) if isinstance(cpu, (int, float)) else 0.0), "self CPU"


def _traced_steps(started: dict[str, Any] | None) -> dict[str, Any]:
    """The steps a window traced, from its profile_started row: the first (its folder's
    profiles/step-N) to the last active one, and the active ones (what the table sums)."""
    if started is None:
        return {"first_step": None, "active_steps": None}
    first, wait, warmup, active = (started.get(k) for k in ("step", "wait", "warmup", "active"))
    if not all(isinstance(v, int) for v in (first, wait, warmup, active)):
        return {"first_step": first if isinstance(first, int) else None, "active_steps": None}
    return {"first_step": first, "active_steps": [first + wait + warmup,
                                                  first + wait + warmup + active - 1]}


def window_label(w: dict[str, Any]) -> str:
    """'steps 30–34 (active 32–34)': the steps the folder's name and the table's sums refer to
    (the table is ready a few steps later, at ``step``)."""
    first, active = w.get("first_step"), w.get("active_steps")
    if first is None:
        return f"ready at step {w.get('step')}"
    if not active:
        return f"from step {first}"
    return f"steps {first}–{active[1]} (active {active[0]}–{active[1]})"


def build(ctx: ReportContext) -> dict[str, Any]:
    started_by_dir = {e.get("dir"): e for e in ctx.metrics.named(R.PROFILE_STARTED)}
    windows = []
    for e in ctx.metrics.named(R.PROFILE_DONE, R.PROFILE_CANCELLED):
        traced = _traced_steps(started_by_dir.get(e.get("dir")))
        if e["event"] == R.PROFILE_DONE:
            ops = e.get("top_ops") if isinstance(e.get("top_ops"), list) else []
            ops, ranges = split_ranges(ops, e.get("phase"))  # a phase window: ops, no labels
            windows.append({"step": e.get("step"), **traced, "status": "done",
                            "dir": e.get("dir"), "phase": e.get("phase"),
                            "sort_by": e.get("sort_by"), "analysis_s": e.get("analysis_s"),
                            "top_ops": ops[:TOP_OPS], "ranges": ranges})
        else:
            windows.append({"step": e.get("step"), **traced, "status": "cancelled",
                            "dir": e.get("dir"), "phase": e.get("phase"),
                            "reason": e.get("reason"), "top_ops": []})
    return {"profiles": windows}


NO_WINDOW = ("No profiler window was taken (press p on the dashboard or in `memtop view`, or "
             "give `--profile-at STEP` headless).")


def _why(window: dict[str, Any]) -> str:
    """A cancelled window's reason; an incomplete event's text when its row has none."""
    return str(window.get("reason") or incomplete(R.PROFILE_CANCELLED, window))


def render(section: dict[str, Any], report: dict[str, Any]) -> list[str]:
    """A training run's windows, each with its top ops on both clocks."""
    md = ["## Profiler windows", ""]
    if not section["profiles"]:
        md += [NO_WINDOW, ""]
    for w in section["profiles"]:
        if w["status"] != "done":
            md += [f"### Window over {window_label(w)}: {w['status']} ({_why(w)})", ""]
            continue
        md += [f"### Window over {window_label(w)} (sorted by {w['sort_by']}; trace in "
               f"`{w['dir']}`)", ""]
        rows = [[op.get("name"), op.get("calls"), format_us(op.get("self_cpu_us")),
                 format_us(op.get("cpu_total_us")), format_us(op.get("self_device_us")),
                 format_us(op.get("device_total_us"))] for op in w["top_ops"]]
        md += [markdown_table(["op", "calls", "self CPU", "CPU total", "self device",
                               "device total"], rows, right={1, 2, 3, 4, 5}), ""]
    return md


def render_by_phase(section: dict[str, Any], report: dict[str, Any]) -> list[str]:
    """An inference run's windows, one per phase (prefill, decode)."""
    md = ["## Profiler windows, one per phase", ""]
    if not section["profiles"]:
        md += [NO_WINDOW.replace("`--profile-at STEP`", "`--profile-phase`"), ""]
    for w in section["profiles"]:
        phase = w.get("phase") or "?"
        if w["status"] != "done":
            md += [f"### {phase}: window {w['status']} ({_why(w)})", ""]
            continue
        md += [f"### {phase} (sorted by {w['sort_by']} time; trace in `{w['dir']}`)", ""]
        ops = [[op.get("name"), op.get("calls"), format_us(op.get("self_cpu_us")),
                format_us(op.get("cpu_total_us")), format_us(op.get("self_device_us"))]
               for op in w["top_ops"]]
        md += [markdown_table(["op", "calls", "self CPU", "CPU total", "self device"], ops,
                              right={1, 2, 3, 4}), ""]
        left_out = ranges_text(phase, w.get("ranges") or [])
        md += [left_out, ""] if left_out else []
    return md
