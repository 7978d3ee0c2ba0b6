"""The old flat scripts' import path, kept for scripts written as ``python benchmarks/X.py``
against ``from common import ...``: everything lives in benchmarks/harness/ now (its
__init__ says what). A new benchmark is a case of benchmarks/cases/<area>/ (benchmarks/README.md,
"Adding a case"); this shim re-exports the harness under the names common.py had.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.harness import *  # noqa: E402,F403
from benchmarks.harness import __all__ as _harness_all  # noqa: E402
from benchmarks.harness.machine import describe  # noqa: E402
from benchmarks.harness.results import append_log, status_of  # noqa: E402


def machine() -> str:
    """One line: CPU model, cores, bf16, RAM, GPU, Python, torch."""
    return describe().line()


def append_results(title: str, body: str) -> None:
    """One dated section in benchmarks/results/YYYY-MM-DD.md (RESULTS.md's rows are written by
    ``benchmarks.harness.publish`` with its figures)."""
    print(f"appended to {append_log(title, body, machine())}")


def publish(title: str, body: str, append: bool, shown: str | None = None) -> None:  # noqa: F811
    """The old signature: the machine line and the figures on stdout, then the dated section
    unless --no-append."""
    print(machine())
    print(body if shown is None else shown)
    if append:
        append_results(title, body)


__all__ = [*(n for n in _harness_all if n != "publish"), "ROOT", "append_results", "machine",
           "publish", "status_of"]
