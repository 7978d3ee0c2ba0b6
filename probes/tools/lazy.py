"""Names a package offers without importing the modules behind them until first use (PEP 562).

A package whose modules import torch (counters/, instruments/, monitor/) or many siblings
(analysis/) lists what it offers in its ``__init__`` and loads a module only when one of its
names is used, so ``from probes.counters import memtop_version`` costs no torch and
``memtop view`` stays light (docs/ARCHITECTURE.md, "Layers").
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any],
                                                                      Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``exports`` maps each public name to
    the module (relative, such as ".memory") that defines it."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module, package), name)

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
