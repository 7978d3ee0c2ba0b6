"""What a profiler leaves behind, read without torch: a Chrome/Kineto trace turned into the
top-ops table (in a child process during a run, or from the command line on any trace).

    from probes.traces import load_trace, read_ops, format_table

    ops = read_ops(load_trace("profiles/step-40/trace.json"))  # device columns found, not asked
    print(format_table(ops.rows, title="top ops"))
    print(ops.device.line())  # launched by ops + unattributed = kernel + memcpy + memset time

    python -m probes.traces.opstable TRACE OUT_DIR [--sort {cpu,device}]

Modules: chrome_trace (the trace read, its events summed per op), opstable (the rows ranked,
phases, the table written), worker (the child process that computes it during a run).
"""

from __future__ import annotations

from probes.tools.lazy import lazy_exports

# Lazy (probes/tools/lazy.py), so `python -m probes.traces.opstable` runs a module the package
# has not imported already.
_EXPORTS = {
    **dict.fromkeys(("DeviceTime", "TraceOps", "aggregate", "load_trace", "read_ops"),
                    ".chrome_trace"),
    **dict.fromkeys(("SORT_KEYS", "analyse", "format_phases", "format_table", "phase_totals",
                     "rank_rows", "rows_from_key_averages", "sort_rows"), ".opstable"),
    **dict.fromkeys(("kill_workers", "spawn_worker"), ".worker"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
