"""What a profiler leaves behind, read without torch: a Chrome/Kineto trace turned into the
top-ops table (in a child process during a run, or from the command line on any trace).

    from probes.traces import load_trace, aggregate, format_table

    rows = aggregate(load_trace("profiles/step-40/trace.json"), use_device=True)
    print(format_table(rows, title="top ops"))

    python -m probes.traces.opstable TRACE OUT_DIR [--sort {cpu,device}]
"""

from __future__ import annotations

from probes.traces.opstable import (
    SORT_KEYS,
    aggregate,
    analyse,
    format_phases,
    format_table,
    kill_workers,
    load_trace,
    phase_totals,
    rank_rows,
    rows_from_key_averages,
    sort_rows,
    spawn_worker,
)

__all__ = [
    "SORT_KEYS", "aggregate", "analyse", "format_phases", "format_table", "kill_workers",
    "load_trace", "phase_totals", "rank_rows", "rows_from_key_averages", "sort_rows",
    "spawn_worker",
]
