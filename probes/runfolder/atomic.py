"""Whole files written atomically: a unique temp file beside the target, then a rename, so a
reader or a crash never sees half a file and two writers never share a temp file. The one
atomic writer of the project (reports, tables, weights, config.json go through it)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def json_safe(value: Any) -> Any:
    """JSON has no inf/nan: write them as null so every line stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_text(path: Path, text: str) -> None:
    """Write a whole file atomically (unique temp file + rename): a reader or a crash never
    sees half a file, and two writers never share one temp file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temp path beside ``path`` to write to; renamed onto ``path`` when the block succeeds,
    removed when it fails (for writers that want a file name, such as torch.save)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: Path, obj: Any) -> None:
    """A whole JSON file, atomically (see write_text); inf/nan become null."""
    write_text(path, json.dumps(json_safe(obj), indent=2, default=str) + "\n")
