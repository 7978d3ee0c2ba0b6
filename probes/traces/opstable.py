"""The top-ops table of a profiler window: the trace's per-op rows (probes/traces/chrome_trace.py,
or torch's own key_averages()) ranked, the user-annotation phases beside them, and the table
written as top_ops.txt and top_ops.json.

    python -m probes.traces.opstable TRACE OUT_DIR [--sort {cpu,device}]

is the table from any trace (device columns and [memory] columns appear when the trace has device
events or memory records; by default a trace with device events is sorted by device time); a
profiler window runs the same command in a child process (probes/traces/worker.py), with the
worker's flags, so training keeps its GIL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from probes.runfolder.atomic import write_text
from probes.tools.units import format_bytes, format_us
from probes.traces.chrome_trace import load_trace, read_ops
from probes.traces.worker import die_with_parent

SORT_KEYS = {"cpu": "self_cpu_us", "device": "self_device_us"}


def rows_from_key_averages(averages: Any, use_device: bool,
                           profile_memory: bool) -> list[dict[str, Any]]:
    """torch's own key_averages() (FunctionEventAvg list) as the rows of
    chrome_trace.aggregate (the window's fallback when no worker can run)."""
    return [{
        "name": e.key, "calls": e.count,
        "self_cpu_us": float(e.self_cpu_time_total), "cpu_total_us": float(e.cpu_time_total),
        "self_device_us": float(e.self_device_time_total) if use_device else None,
        "device_total_us": float(e.device_time_total) if use_device else None,
        "cpu_memory_bytes": int(e.cpu_memory_usage) if profile_memory else None,
        "device_memory_bytes": (int(e.device_memory_usage) if profile_memory and use_device
                                else None),
        "user_annotation": bool(getattr(e, "is_user_annotation", False)),
        "on_device": getattr(getattr(e, "device_type", None), "name", "CPU") != "CPU",
    } for e in averages]


def rank_rows(rows: list[dict[str, Any]], sort_by: str) -> list[dict[str, Any]]:
    """The ops table's order. By device time, user annotations (ProfilerStep#, forward,
    backward, optimizer: record_function ranges and their gpu_user_annotation spans) are left
    out: a span covers every kernel inside it, idle gaps included, so it would top the table
    ahead of every kernel; ``phase_totals`` shows them instead."""
    if sort_by == "device":
        rows = [r for r in rows if not r.get("user_annotation")]
    return sort_rows(rows, sort_by)


def phase_totals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per user annotation: calls and CPU time of the host range, and the device span (first
    kernel start to last kernel end, gaps included) of its gpu_user_annotation twin."""
    phases: dict[str, dict[str, Any]] = {}
    for r in rows:
        if not r.get("user_annotation"):
            continue
        ph = phases.setdefault(r["name"], {"name": r["name"], "calls": 0, "cpu_total_us": None,
                                           "device_span_us": None})
        if r.get("on_device"):
            ph["device_span_us"] = r.get("device_total_us")
        else:
            ph["calls"] = r["calls"]
            ph["cpu_total_us"] = r["cpu_total_us"]
    return list(phases.values())


def format_phases(phases: list[dict[str, Any]]) -> str:
    """The phase totals under the ops table ("" when there are none)."""
    if not phases:
        return ""
    lines = [f"{'Phase (user annotation)':<40}{'CPU total':>14}{'Device span':>14}{'Calls':>9}"]
    for ph in phases:
        lines.append(f"{ph['name'][:38]:<40}{_us_cell(ph['cpu_total_us']):>14}"
                     f"{_us_cell(ph['device_span_us']):>14}{ph['calls']:>9}")
    return "\n".join(lines) + "\n"


def sort_rows(rows: list[dict[str, Any]], sort_by: str) -> list[dict[str, Any]]:
    """Highest self time first ("cpu" or "device"), ties by total time then name."""
    key = SORT_KEYS[sort_by]
    total = "cpu_total_us" if sort_by == "cpu" else "device_total_us"
    return sorted(rows, key=lambda r: (-(r[key] or 0.0), -(r[total] or 0.0), r["name"]))


def _us_cell(us: float | None) -> str:
    return format_us(us, na="-")


def _bytes_cell(n: int | None) -> str:
    return format_bytes(n, na="-")


def format_table(rows: list[dict[str, Any]], title: str = "", name_width: int = 60) -> str:
    """A fixed-width text table like torch's, with only the columns that were measured."""
    cols: list[tuple[str, str, Any]] = [("Self CPU", "self_cpu_us", _us_cell),
                                        ("CPU total", "cpu_total_us", _us_cell)]
    if any(r["self_device_us"] is not None for r in rows):
        cols += [("Self device", "self_device_us", _us_cell),
                 ("Device total", "device_total_us", _us_cell)]
    if any(r["cpu_memory_bytes"] is not None for r in rows):
        cols.append(("CPU mem", "cpu_memory_bytes", _bytes_cell))
    if any(r["device_memory_bytes"] is not None for r in rows):
        cols.append(("Device mem", "device_memory_bytes", _bytes_cell))
    header = f"{'Name':<{name_width}}" + "".join(f"{c[0]:>14}" for c in cols) + f"{'Calls':>9}"
    rule = "-" * len(header)
    lines = [title] if title else []
    lines += [rule, header, rule]
    for r in rows:
        name = r["name"] if len(r["name"]) <= name_width - 2 else r["name"][:name_width - 5] + "..."
        lines.append(f"{name:<{name_width}}" + "".join(f"{fmt(r[k]):>14}" for _, k, fmt in cols)
                     + f"{r['calls']:>9}")
    lines.append(rule)
    return "\n".join(lines) + "\n"


def analyse(trace_path: Path, out_dir: Path, sort_by: str | None = None, top: int = 20,
            use_device: bool | None = None, profile_memory: bool | None = None,
            table_rows: int = 100) -> dict[str, Any]:
    """Trace -> top_ops.txt (table) and top_ops.json (the top rows); returns the JSON object.

    ``sort_by`` None: by device time when the trace has device events, else by CPU time; a
    device sort asked of a trace without device events falls back to CPU time and says so.
    ``use_device`` / ``profile_memory`` None: found from the trace (chrome_trace.read_ops)."""
    t0 = time.perf_counter()
    trace = load_trace(trace_path)
    ops = read_ops(trace, use_device, profile_memory)
    every = ops.rows
    has_device = any(r["self_device_us"] is not None for r in every)
    note = ""
    if sort_by is None:
        sort_by = "device" if has_device else "cpu"
    elif sort_by == "device" and not has_device:
        sort_by, note = "cpu", " (no device events in this trace)"
    rows = rank_rows(every, sort_by)
    phases = phase_totals(every)
    n_events = sum(1 for e in trace.get("traceEvents", []) if e.get("ph") == "X")
    del trace
    total_self = sum(r["self_cpu_us"] for r in rows)
    title = (f"top ops of {trace_path.name}{' on ' + ops.gpu if ops.gpu else ''}, sorted by "
             f"self {sort_by} time{note}; {n_events} trace events, self CPU total "
             f"{_us_cell(total_self)}")
    footer = f"{ops.device.line()}\n" if ops.device is not None else ""
    write_text(out_dir / "top_ops.txt", format_table(rows[:table_rows], title)
               + footer + format_phases(phases))
    result = {"sort_by": sort_by, "top_ops": rows[:top], "ops": len(rows), "events": n_events,
              "phases": phases, "gpu": ops.gpu,
              "device_time": dataclasses.asdict(ops.device) if ops.device else None,
              "analysis_s": time.perf_counter() - t0}
    write_text(out_dir / "top_ops.json", json.dumps(result, indent=1) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m probes.traces.opstable",
                                     description="Top-ops table from a torch profiler trace.")
    parser.add_argument("trace", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--sort", choices=sorted(SORT_KEYS), default=None,
                        help="default: device when the trace has device events, else cpu")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--device", action="store_true",
                        help="device columns even without device events (found from the trace "
                             "otherwise)")
    parser.add_argument("--memory", action="store_true",
                        help="memory columns even without [memory] records (found otherwise)")
    parser.add_argument("--nice", type=int, default=0, help="lower this process's priority")
    parser.add_argument("--wait-for-go", action="store_true",
                        help="wait for a line 'go' on stdin first; exit on anything else")
    parser.add_argument("--parent", type=int, default=None,
                        help="exit when this process (the one that started us) dies")
    args = parser.parse_args(argv)
    if args.parent is not None:
        die_with_parent(args.parent)
    if args.nice:
        with contextlib.suppress(OSError):
            os.nice(args.nice)
    if args.wait_for_go and sys.stdin.readline().strip() != "go":
        return 0  # the window was cancelled
    analyse(args.trace, args.out_dir, args.sort, args.top, args.device or None,
            args.memory or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
