"""Which frame of a stack is the user's: the first one not in torch, memtop, the standard
library or an installed package. The culprit finder names an allocation or a hook by it, so a
user reads their own file:line, not torch's.

Library or user code is decided by where a module was imported from, not by its path's text
(issue 45: textual installed with ``pip install --target`` and put on PYTHONPATH, a path with no
"site-packages" in it, was taken for the user's code on the GPU box): a file is a library's when
it lies under the standard library, this interpreter's site directories, or a ``sys.path``
entry that holds installed distributions (a ``*.dist-info`` folder: what pip writes into
site-packages and into a ``--target`` folder alike), or inside a zip on ``sys.path``. A folder
on ``sys.path`` that holds no distribution (the script's own, the working directory, a
PYTHONPATH entry of the user's sources) is the user's.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from collections.abc import Iterable

_MEMTOP_DIRS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), name) + os.sep for name in ("probes", "tui"))


def _dirs(paths: Iterable[str | None]) -> set[str]:
    out: set[str] = set()
    for p in paths:
        if p:
            out.add(os.path.abspath(p) + os.sep)
            out.add(os.path.realpath(p) + os.sep)
    return out


_STDLIB_DIRS = tuple(_dirs(sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib")))


def _site_dirs() -> set[str]:
    paths = [sysconfig.get_paths().get(k) for k in ("purelib", "platlib")]
    try:
        paths += site.getsitepackages()
    except AttributeError:  # a virtualenv's old site.py
        pass
    user = getattr(site, "getusersitepackages", None)
    if user is not None:
        try:
            paths.append(user())
        except Exception:
            pass
    return _dirs(paths)


def _holds_distributions(path: str) -> bool:
    """Whether a sys.path folder holds installed distributions (pip's ``*.dist-info``)."""
    try:
        with os.scandir(path) as entries:
            return any(e.name.endswith(".dist-info") and e.is_dir() for e in entries)
    except OSError:
        return False


_roots_for: tuple[tuple[str, ...], tuple[str, ...]] | None = None  # (sys.path, its roots)


def library_roots() -> tuple[str, ...]:
    """The folders (ending in the path separator) whose files are a library's, not the user's,
    for the sys.path of now (looked up again when sys.path changes)."""
    global _roots_for
    key = tuple(sys.path)
    cached = _roots_for
    if cached is not None and cached[0] == key:
        return cached[1]
    roots = set(_STDLIB_DIRS) | _site_dirs()
    for entry in key:
        if not entry or not isinstance(entry, str):
            continue  # "": the working directory, the user's
        path = os.path.abspath(entry)
        if os.path.isfile(path) or _holds_distributions(path):  # a zip, or installed packages
            roots |= _dirs([path])
    out = tuple(sorted(roots))
    _roots_for = (key, out)
    return out


def _distribution_roots() -> tuple[str, ...]:
    """library_roots less the standard library's own folders (site-packages lies inside one)."""
    return tuple(r for r in library_roots() if r not in _STDLIB_DIRS)


def is_user_file(filename: str) -> bool:
    """True for a file of the user's code (not torch, memtop, the standard library, an
    installed package wherever it was installed, <frozen>)."""
    if not filename or filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    if path.startswith(_MEMTOP_DIRS):
        return False
    roots = library_roots()
    return not path.startswith(roots) and not os.path.realpath(path).startswith(roots)


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
    """A file of the standard library (or <frozen>): not one of an installed package, though
    site-packages lies inside the standard library's folder."""
    if filename.startswith("<"):
        return True
    path = os.path.abspath(filename)
    real = os.path.realpath(path)
    dists = _distribution_roots()
    if path.startswith(dists) or real.startswith(dists):
        return False
    return path.startswith(_STDLIB_DIRS) or real.startswith(_STDLIB_DIRS)


def where(filename: str, line: int) -> str:
    """"train.py:42"."""
    return f"{short_path(filename)}:{line}"
