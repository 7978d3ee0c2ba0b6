"""The experiment report (docs/ARCHITECTURE.md, "The method"): report.json + report.md built
from a run folder alone.

    from probes.analysis.report import write_report
    write_report(run_dir)      # -> run_dir / "report.md"; ReportError for a folder it cannot read
"""

from __future__ import annotations

from probes.tools.lazy import lazy_exports

_EXPORTS = {"build_report": ".build", "write_report": ".build", "ReportError": ".read"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
