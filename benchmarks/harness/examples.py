"""The scripts of examples/ as modules (own_loop's CNN and batches, leaky_loops' leaks, the HF
and Lightning set-ups): the cases measure what a user of those examples runs."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from benchmarks.harness.paths import ROOT


def example(name: str) -> ModuleType:
    """examples/<name>.py, imported (examples/ is not a package: it goes on sys.path)."""
    folder = str(ROOT / "examples")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)
