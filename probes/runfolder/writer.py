"""metrics.jsonl written: one JSON object a line, appended and flushed line by line."""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path
from typing import Any

from probes.records import Record
from probes.runfolder.atomic import json_safe


def json_line(row: dict[str, Any]) -> str:
    """One metrics.jsonl line (without the newline)."""
    try:  # the usual row has no inf/nan: encoded as is (the per-step path, no copy)
        return json.dumps(row, separators=(",", ":"), default=str, allow_nan=False)
    except ValueError:
        return json.dumps(json_safe(row), separators=(",", ":"), default=str)


class MetricsWriter:
    """Appends one JSON object per line and flushes each line; safe to call from any thread.

    A killed process loses at most the line being written; every earlier line is complete.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fh = open(self.path, "a", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()

    def write_row(self, row: dict[str, Any]) -> None:
        line = json_line(row) + "\n"
        with self._lock:
            self._fh.write(line)
            self._fh.flush()

    def write(self, record: Record) -> None:
        self.write_row(record.to_json())

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                with contextlib.suppress(OSError):
                    self._fh.close()
