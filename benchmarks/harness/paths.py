"""Where things are: the repository root (the cases run memtop from it), benchmarks/, RESULTS.md
and the dated logs under results/."""

from __future__ import annotations

from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
ROOT = BENCH.parent
RESULTS = BENCH / "RESULTS.md"
LOGS = BENCH / "results"
