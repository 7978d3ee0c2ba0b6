"""Reading finished or running runs for people: the experiment report, comparisons of runs,
the live baseline, the B×T sweep, the list of runs, and several ranks read back. Reads run
folders only and never imports torch, so it runs anywhere a run folder was copied to.

    from probes.analysis import write_report, compare_runs, summarize_run

    write_report("runs/20261202-101500-ab12cd")   # report.md + report.json, atomically
    result = compare_runs(["runs/a", "runs/b"])    # what changed, inside or outside the noise
    summarize_run(run_dir).state                   # "running", "finished", "failed", ...

Names load lazily (probes/tools/lazy.py): `memtop runs` should not load the report's code.
"""

from __future__ import annotations

from probes.tools.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("build_report", "write_report"), ".report.build"),
    "ReportError": ".report.context",
    "peak_flops": ".report.flops",
    **dict.fromkeys(("CompareError", "RunFigures", "compare_runs", "gate", "load_run"),
                    ".compare.compare"),
    "DEFAULT_LOSS_TOLERANCE": ".compare.windows",
    **dict.fromkeys(("BaselineWatch", "load_baseline"), ".baseline"),
    **dict.fromkeys(("RunSummary", "summarize_run"), ".runlist"),
    **dict.fromkeys(("RankEnd", "failure_text", "rank_ends", "read_process_exits", "spread"),
                    ".ranks"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
