"""memtop probes: counters, instruments, the run folder and the public Monitor API for any loop.

``from probes import Monitor`` (docs/ARCHITECTURE.md). This package imports no Textual; the UI
lives in ``tui/``. Monitor is imported lazily so that reading a run folder (``memtop view``)
never imports torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Monitor", "MemtopError"]


def __getattr__(name: str) -> Any:
    if name == "Monitor":
        from probes.monitor.monitor import Monitor

        return Monitor
    if name == "MemtopError":
        from probes.records.errors import MemtopError

        return MemtopError
    raise AttributeError(f"module 'probes' has no attribute {name!r}")
