"""What a profiler window leaves on disk, and the quiet around it: fd 2 sent to the run's
stderr.log while torch's profiler talks, the Chrome trace exported under a temporary name
beside window.json, and the top-ops table computed in this process when no child process can
do it (probes/traces/opstable.py computes it from the trace otherwise). The window's state
machine, which calls these, is probes/instruments/profwindow.py.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from probes.runfolder import write_json
from probes.traces.opstable import (
    format_phases,
    format_table,
    phase_totals,
    rank_rows,
    rows_from_key_averages,
)

TRACE_NAME = "trace.json"


@contextlib.contextmanager
def stderr_to(fd: int | None) -> Iterator[None]:
    """Send fd 2 to ``fd`` while the profiler's C++ side talks ("USDT ... profiler_start",
    "External init callback must run in same thread"): the terminal never sees it."""
    saved = None
    if fd is not None:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        try:
            saved = os.dup(2)
            os.dup2(fd, 2)
        except OSError:  # no fd 2 to redirect (a daemon): nothing reaches a terminal anyway
            if saved is not None:
                os.close(saved)
            saved = None
    try:
        yield
    finally:
        if saved is not None:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def export_trace(prof: Any, out_dir: Path, info: dict[str, Any]) -> float:
    """trace.json (written to a temporary name, then renamed) and window.json into
    ``out_dir``; the seconds the export took. Raises what the export raised (a full disk),
    leaving no half-written trace behind."""
    t0 = time.perf_counter()
    tmp = out_dir / (TRACE_NAME + ".tmp")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, out_dir / TRACE_NAME)
        write_json(out_dir / "window.json", info)
    except Exception:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return time.perf_counter() - t0


def analyse_in_process(prof: Any, out_dir: Path, *, sort_by: str, top_n: int,
                       use_device: bool, profile_memory: bool) -> dict[str, Any]:
    """torch's own key_averages() on this thread: exact, but holds the GIL (~0.6 s), so only
    the fallback when no child process can start; writes top_ops.txt and top_ops.json."""
    t0 = time.perf_counter()
    every = rows_from_key_averages(prof.key_averages(), use_device, profile_memory)
    rows, phases = rank_rows(every, sort_by), phase_totals(every)
    (out_dir / "top_ops.txt").write_text(
        format_table(rows[:100], f"top ops (key_averages), sorted by self {sort_by} time")
        + format_phases(phases), encoding="utf-8")
    result = {"sort_by": sort_by, "top_ops": rows[:top_n], "ops": len(rows),
              "phases": phases, "analysis_s": time.perf_counter() - t0}
    write_json(out_dir / "top_ops.json", result)
    return result
