"""The old flat scripts' import path (``from terminal import TmuxPane, ...``): the real terminal
lives in benchmarks/harness/terminal.py now; this shim re-exports it, the same objects."""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness.terminal import (  # noqa: E402
    GC_WRAPPER,
    SMOKE_ARGS,
    TINY,
    TmuxPane,
    apply_run_options,
    memtop_argv,
    run_folder,
)

__all__ = ["GC_WRAPPER", "SMOKE_ARGS", "TINY", "TmuxPane", "apply_run_options", "memtop_argv",
           "run_folder"]
