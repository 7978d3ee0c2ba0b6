"""The run directory: one folder per run, never overwritten, and the metrics.jsonl writer."""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

from probes.sample import Event, StepSample


class RunDirError(ValueError):
    """The run directory cannot be created or written (bad input: exit 2)."""


def create_run_dir(root: str | os.PathLike[str]) -> Path:
    """Make ``root/<YYYYmmdd-HHMMSS>-<id>/``; the random id keeps two runs in one second apart."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        msg = (f"cannot create run directory root {root}: {exc.strerror or exc}; "
               "pass --run-dir DIR to write elsewhere")
        raise RunDirError(msg) from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise RunDirError(f"run directory root {root} is not writable; pass --run-dir DIR")
    for _ in range(10):
        path = root / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
        except OSError as exc:
            msg = f"cannot create run directory {path}: {exc.strerror or exc}"
            raise RunDirError(msg) from None
    raise RunDirError(f"could not find a fresh run directory name under {root}")


def _clean(value: Any) -> Any:
    """JSON has no inf/nan: write them as null so every line stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(path: Path, obj: Any) -> None:
    """Write a whole JSON file atomically (temp file + rename): a crash never leaves half a file."""
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:  # a unique temp name: two writers never share one half-written file
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, indent=2, sort_keys=False, default=str)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class MetricsWriter:
    """Appends one JSON object per line to metrics.jsonl and flushes each line.

    A killed process loses at most the line being written; every earlier line is complete.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh = open(path, "a", encoding="utf-8", buffering=1)

    def write_row(self, row: dict[str, Any]) -> None:
        line = json.dumps({k: _clean(v) for k, v in row.items()}, separators=(",", ":"))
        self._fh.write(line + "\n")
        self._fh.flush()

    def write_sample(self, sample: StepSample) -> None:
        self.write_row(sample.to_json())

    def write_event(self, event: Event) -> None:
        self.write_row(event.to_json())

    def close(self) -> None:
        if not self._fh.closed:
            try:
                self._fh.close()
            except OSError:
                pass


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(step rows, event rows, number of unreadable lines) from a metrics.jsonl."""
    steps: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    bad = 0
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if not isinstance(row, dict):
                bad += 1
            elif "event" in row:
                events.append(row)
            else:
                steps.append(row)
    return steps, events, bad
