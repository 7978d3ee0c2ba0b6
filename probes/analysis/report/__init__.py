"""The experiment report (docs/ARCHITECTURE.md, "The method"): report.json + report.md built
from a run folder alone, section by section (sections/: one module each, in one ordered list).

    from probes.analysis.report import write_report
    write_report(run_dir)      # -> run_dir / "report.md"; ReportError for a folder it cannot read

Modules: context (the run read once, config checked), sections/ (what each part builds and
renders), flops (FLOPs per token and device peaks, for MFU), build (sections -> files).
"""

from __future__ import annotations

from probes.tools.lazy import lazy_exports

_EXPORTS = {"build_report": ".build", "write_report": ".build", "ReportError": ".context",
            "peak_flops": ".flops"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
