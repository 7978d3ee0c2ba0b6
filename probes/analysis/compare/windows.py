"""Profiler windows read back from a run folder, for `memtop compare`: what a window's options
(record_shapes, profile_memory) cost in step time, export and analysis seconds, and trace size
(tutorial exercise 5)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from probes import records as R
from probes.records import finite_num
from probes.tools.stats import band

# here, not in probes/analysis/compare/compare.py, so that building the CLI's parser does not load
# the report code
DEFAULT_LOSS_TOLERANCE = 0.05  # relative, on the 10-step mean loss


def profile_windows(events: list[dict[str, Any]], steps: list[dict[str, Any]],
                    run_dir: Path) -> list[dict[str, Any]]:
    """Each profiler window: its options, the step times of its active steps (the last one
    also exports the trace), the export and analysis seconds, and the trace's size on disk:
    what record_shapes / profile_memory cost (tutorial exercise 5)."""
    by_step = {r["step"]: r for r in steps}
    out: list[dict[str, Any]] = []
    for e in events:
        name = e.get("event")
        if name == R.PROFILE_STARTED and isinstance(e.get("step"), int):
            first = e["step"] + int(e.get("wait") or 0) + int(e.get("warmup") or 0)
            active = range(first, first + int(e.get("active") or 1))
            trace = run_dir / str(e.get("dir")) / "trace.json"
            out.append({"step": e["step"], "dir": e.get("dir"),
                        "record_shapes": bool(e.get("record_shapes")),
                        "profile_memory": bool(e.get("profile_memory")),
                        "active_step_ms": [v for s in active if s in by_step
                                           and (v := finite_num(by_step[s].get("step_ms")))
                                           is not None],
                        "export_s": None, "analysis_s": None,
                        "trace_bytes": trace.stat().st_size if trace.is_file() else None})
        elif name in (R.PROFILE_ANALYSING, R.PROFILE_DONE) and out:
            w = next((w for w in reversed(out) if w["dir"] == e.get("dir")), out[-1])
            key = "export_s" if name == R.PROFILE_ANALYSING else "analysis_s"
            w[key] = finite_num(e.get(key))
    return out


def windows_summary(windows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One run's windows together: their active step times, seconds and trace bytes."""
    if not windows:
        return None
    ms = [v for w in windows for v in w["active_step_ms"]]

    def total(key: str) -> float | None:
        vals = [w[key] for w in windows if w[key] is not None]
        return sum(vals) if vals else None

    return {"windows": len(windows),
            "record_shapes": sorted({w["record_shapes"] for w in windows}),
            "active_step_ms": band(ms), "export_s": total("export_s"),
            "analysis_s": total("analysis_s"), "trace_bytes": total("trace_bytes")}
