"""A CUDA memory snapshot (``torch.cuda.memory._dump_snapshot()``, the ``m`` key's file) read
without torch and without running anything it contains: its segments, blocks and allocation
history summed, and the live allocations grouped by the first frame of the user's code.

A snapshot is a pickle of plain dicts and lists. It is read with an Unpickler whose
``find_class`` refuses every name, so a pickle that asks for a class or a function (a hostile
one naming ``os.system``) is refused before anything in it runs (SnapshotError).
"""

from __future__ import annotations

import io
import pickle
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probes.tools.frames import is_user_path, short_path


class SnapshotError(ValueError):
    """The file is not a snapshot memtop can read safely; the message says why, in one line."""


class _NoClasses(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise SnapshotError(f"it asks for the Python object {module}.{name}: refused, nothing "
                            "in it was run (a memory snapshot holds only dicts and lists)")


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """The snapshot's dict; SnapshotError for a missing, foreign or unsafe file."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise SnapshotError(f"cannot read {p}: {exc.strerror or exc}") from None
    try:
        snap = _NoClasses(io.BytesIO(data)).load()
    except SnapshotError as exc:
        raise SnapshotError(f"{p}: {exc}") from None
    except Exception as exc:  # not a pickle, truncated, ...
        raise SnapshotError(f"{p} is not a pickle ({type(exc).__name__}: {exc})") from None
    if not isinstance(snap, dict) or not isinstance(snap.get("segments"), list):
        raise SnapshotError(f"{p} is a pickle but not a CUDA memory snapshot (no segments "
                            "list)")
    return snap


@dataclass(frozen=True)
class Site:
    """Live allocations made from one line of the user's code."""

    where: str  # "model.py:39 forward"
    bytes: int
    blocks: int


@dataclass(frozen=True)
class SnapshotSummary:
    reserved_bytes: int
    segments: int
    large_segments: int
    allocated_bytes: int
    active_blocks: int
    free_bytes: int
    inactive_blocks: int
    largest_free_bytes: int
    expandable_segments: bool | None
    history_entries: int
    actions: dict[str, int] = field(default_factory=dict)
    sites: list[Site] = field(default_factory=list)  # live allocations by user line, biggest first


def _num(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def user_site(frames: Any) -> str | None:
    """"model.py:39 forward" for the first frame of the user's code (innermost first)."""
    for f in frames if isinstance(frames, list) else []:
        if not isinstance(f, Mapping):
            continue
        name, line = str(f.get("filename") or ""), f.get("line")
        if is_user_path(name):
            base = name.replace("\\", "/").rsplit("/", 1)[-1]
            return f"{base}:{line} {f.get('name') or '?'}"
    return None


def live_by_site(traces: Sequence[Any], since_us: int | None = None) -> list[Site]:
    """Allocations of the history still alive at its end (an alloc with no later free of
    its address), grouped by the user's line; with ``since_us`` only those made from then on
    (the culprit finder's window)."""
    live: dict[int, Mapping[str, Any]] = {}
    for entry in traces:
        if not isinstance(entry, Mapping):
            continue
        action, addr = entry.get("action"), entry.get("addr")
        if action == "alloc":
            live[_num(addr)] = entry
        elif action in ("free_requested", "free_completed"):
            live.pop(_num(addr), None)
    sizes: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for entry in live.values():
        if since_us is not None and _num(entry.get("time_us")) < since_us:
            continue
        where = user_site(entry.get("frames")) or "(no frame of your code)"
        sizes[where] += _num(entry.get("size"))
        counts[where] += 1
    return [Site(w, b, counts[w]) for w, b in sizes.most_common()]


def summarize(snap: Mapping[str, Any]) -> SnapshotSummary:
    segments = [s for s in snap.get("segments") or [] if isinstance(s, Mapping)]
    blocks = [b for s in segments for b in s.get("blocks") or [] if isinstance(b, Mapping)]
    active = [b for b in blocks if b.get("state") == "active_allocated"]
    inactive = [b for b in blocks if b.get("state") == "inactive"]
    traces = [e for dev in snap.get("device_traces") or [] if isinstance(dev, list)
              for e in dev]
    settings = snap.get("allocator_settings")
    expandable = settings.get("expandable_segments") if isinstance(settings, Mapping) else None
    return SnapshotSummary(
        reserved_bytes=sum(_num(s.get("total_size")) for s in segments),
        segments=len(segments),
        large_segments=sum(1 for s in segments if s.get("segment_type") == "large"),
        allocated_bytes=sum(_num(b.get("size")) for b in active),
        active_blocks=len(active),
        free_bytes=sum(_num(b.get("size")) for b in inactive),
        inactive_blocks=len(inactive),
        largest_free_bytes=max((_num(b.get("size")) for b in inactive), default=0),
        expandable_segments=expandable if isinstance(expandable, bool) else None,
        history_entries=len(traces),
        actions=dict(Counter(str(e.get("action")) for e in traces if isinstance(e, Mapping))),
        sites=live_by_site(traces))


__all__ = ["Site", "SnapshotError", "SnapshotSummary", "live_by_site", "load_snapshot",
           "short_path", "summarize", "user_site"]
