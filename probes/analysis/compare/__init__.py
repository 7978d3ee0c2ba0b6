"""`memtop compare`: runs side by side against the first, each difference judged against the
runs' own noise (tutorial §6.1, §6.2; the statistics in stats.py); with memory windows in
both, each module's bytes B − A (modules.py).

    from probes.analysis.compare import compare_runs
    result = compare_runs(["runs/fp32", "runs/bf16"])
"""

from __future__ import annotations

from probes.tools.lazy import lazy_exports

_EXPORTS = {"compare_runs": ".compare", "gate": ".compare", "load_run": ".compare",
            "render_markdown": ".text", "DEFAULT_LOSS_TOLERANCE": ".windows",
            "module_changes": ".modules"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
