"""Where things are: the repository root (the cases run memtop from it), benchmarks/, RESULTS.md
and the dated logs under results/. MEMTOP_BENCHMARK_RESULTS names another folder holding a
RESULTS.md and its results/ (a test's copy: tests/unit/test_results_table.py)."""

from __future__ import annotations

import os
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
ROOT = BENCH.parent
_HOME = Path(os.environ.get("MEMTOP_BENCHMARK_RESULTS") or BENCH)
RESULTS = _HOME / "RESULTS.md"
LOGS = _HOME / "results"
