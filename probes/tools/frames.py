"""Which frame of a stack is the user's: the first one not in torch, memtop, the standard
library or an installed package. The culprit finder names an allocation or a hook by it, so a
user reads their own file:line, not torch's."""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Iterable

_MEMTOP_DIRS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), name) + os.sep for name in ("probes", "tui"))
_LIBRARY_DIRS = tuple({os.path.realpath(p) + os.sep for key in ("stdlib", "platstdlib",
                                                                 "purelib", "platlib")
                       if (p := sysconfig.get_paths().get(key))})


def is_user_file(filename: str) -> bool:
    """True for a file of the user's code (not torch, memtop, stdlib, site-packages, <frozen>)."""
    if not filename or filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    if "site-packages" in path or "dist-packages" in path or path.startswith(_MEMTOP_DIRS):
        return False
    real = os.path.realpath(path)
    return not real.startswith(_LIBRARY_DIRS) and not path.startswith(_LIBRARY_DIRS)


_LIBRARY_MARKS = ("site-packages", "dist-packages", "/lib/python3", "\\lib\\", "/torch/",
                  "\\torch\\")


def is_user_path(filename: str) -> bool:
    """Like ``is_user_file`` for a path recorded on another machine (a snapshot's frames, a
    Windows path): judged by its text alone."""
    if not filename or filename.startswith("<"):
        return False
    low = filename.replace("\\", "/").lower()
    return not any(mark.replace("\\", "/") in low for mark in _LIBRARY_MARKS) \
        and "/probes/" not in low and "/tui/" not in low


def short_path(filename: str) -> str:
    """A file's name as a user reads it: relative to the working directory when under it."""
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


def first_user_frame(frames: Iterable[tuple[str, int]]) -> tuple[str, int] | None:
    """The first (filename, line) of ``frames`` (innermost first) that is the user's code."""
    for filename, line in frames:
        if is_user_file(filename):
            return filename, line
    return None


def allocating_user_frame(frames: Iterable[tuple[str, int]]) -> tuple[str, int] | None:
    """The user's line that made an allocation itself (innermost first; only standard
    library frames may lie between): what torch, memtop or another package allocates
    (a UI's event loop on another thread, say) is not blamed on the user line that called in."""
    for filename, line in frames:
        if is_user_file(filename):
            return filename, line
        if not is_stdlib_file(filename):
            return None
    return None


def is_stdlib_file(filename: str) -> bool:
    path = os.path.abspath(filename)
    if "site-packages" in path or "dist-packages" in path:
        return False
    return filename.startswith("<") or path.startswith(_LIBRARY_DIRS) \
        or os.path.realpath(path).startswith(_LIBRARY_DIRS)


def where(filename: str, line: int) -> str:
    """"train.py:42"."""
    return f"{short_path(filename)}:{line}"
