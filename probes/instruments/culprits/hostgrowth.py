"""Host memory that is not tensors: Python objects growing (tracemalloc, only between the
finder's two looks) and cycles that a disabled gc leaves in memory.

tracemalloc is started at the first look and stopped at the second, so it costs nothing at
other times; the diff is grouped by the allocating frame of the user's code
(probes/tools/frames.py), so ``kept.append(bytearray(65536))`` is named by its own line. When
the user turned gc off, what a collection would free is counted by one collection with
``gc.DEBUG_SAVEALL``: the unreachable objects go to ``gc.garbage`` instead of being freed, are
counted, and are let go again, still uncollected, as they were (the pass does clear weak
references to them and runs their ``__del__``, as a collection would; the event says so).
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from probes.instruments.culprits.census import tensor_bytes
from probes.tools.frames import allocating_user_frame, is_user_file, where

TRACE_FRAMES = 16  # frames kept per allocation: enough to get past torch and the stdlib


@dataclass(frozen=True)
class HostLine:
    """One line of the user's code whose allocations grew between the looks."""

    where: str  # "train.py:55"
    bytes: int
    blocks: int


class HostWindow:
    """tracemalloc between the two looks (left alone if the user runs it already)."""

    def __init__(self) -> None:
        self.ours = False
        self.before: tracemalloc.Snapshot | None = None

    def start(self) -> None:
        if tracemalloc.is_tracing():
            self.before = tracemalloc.take_snapshot()  # the user's own tracing: share it
        else:
            tracemalloc.start(TRACE_FRAMES)
            self.ours = True
            self.before = tracemalloc.take_snapshot()

    def stop(self, min_bytes: int) -> list[HostLine]:
        """The user lines that grew by at least ``min_bytes``, biggest first; tracing off."""
        if self.before is None or not tracemalloc.is_tracing():
            return []
        after = tracemalloc.take_snapshot()
        if self.ours:
            tracemalloc.stop()
        grown = group_by_user_line(self.before, after)
        self.before = None
        return [line for line in grown if line.bytes >= min_bytes]

    def cancel(self) -> None:
        if self.ours and tracemalloc.is_tracing():
            tracemalloc.stop()
        self.ours, self.before = False, None


def group_by_user_line(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot) \
        -> list[HostLine]:
    """Growth of live allocations per user line that made them (tracemalloc lists the
    oldest frame first; probes/tools/frames.py ``allocating_user_frame``)."""
    sizes: Counter[str] = Counter()
    blocks: Counter[str] = Counter()
    for stat in after.compare_to(before, "traceback"):
        if stat.size_diff <= 0:
            continue
        frame = allocating_user_frame((f.filename, f.lineno) for f in reversed(stat.traceback))
        if frame is None:
            continue
        key = where(*frame)
        sizes[key] += stat.size_diff
        blocks[key] += max(0, stat.count_diff)
    return [HostLine(k, v, blocks[k]) for k, v in sizes.most_common()]


@dataclass(frozen=True)
class Unreachable:
    """What ``gc.collect()`` would free now."""

    objects: int
    tensors: int
    tensor_bytes: int
    top_type: str | None  # the most common class among them, "module.Class"


def unreachable_now() -> Unreachable:
    """Counted by one DEBUG_SAVEALL collection; nothing is freed (module docstring)."""
    flags = gc.get_debug()
    start = len(gc.garbage)
    try:
        gc.set_debug(flags | gc.DEBUG_SAVEALL)
        gc.collect()
    finally:
        gc.set_debug(flags)
    found: list[Any] = gc.garbage[start:]
    del gc.garbage[start:]
    types_seen: Counter[tuple[bool, str]] = Counter()  # the user's own classes first
    tensors = nbytes = 0
    for obj in found:
        if isinstance(obj, torch.Tensor):
            tensors += 1
            nbytes += tensor_bytes(obj)
        elif type(obj).__module__ != "builtins":
            cls = type(obj)
            mod = sys.modules.get(cls.__module__)
            users_own = is_user_file(getattr(mod, "__file__", None) or "")
            types_seen[(users_own, f"{cls.__module__}.{cls.__qualname__}")] += 1
    count = len(found)
    found.clear()
    del found
    top = max(types_seen, key=lambda k: (k[0], types_seen[k]))[1] if types_seen else None
    return Unreachable(count, tensors, nbytes, top)


def gc_is_off() -> bool:
    return not gc.isenabled() and sys.is_finalizing() is False
