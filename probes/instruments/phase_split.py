"""The arithmetic of the step split, free of hooks and devices, so it is tested on CPU for both
clocks: a step's marks (host ``perf_counter`` seconds on CPU, CUDA events on CUDA) turned into
the five phase fields of a step row, and the queue that reads CUDA events one step later.

A mark is whatever the clock stamps: the split only asks ``elapsed_ms(a, b)`` of two marks and,
for a queue of CUDA steps, ``ready(mark)`` (``Event.query()``: never a sync). Why ``other_ms``
is clamped at zero: the phases are disjoint on one clock (forward passes outside backward, the
optimizer after both), so their sum exceeds the step's span only by the clocks' rounding (CUDA
events resolve ~0.5 µs) or a hook that fired outside the phase it closes (a forward inside
backward under activation checkpointing is not counted, for that reason); a negative "other"
would be a figure nothing spent.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from probes.records import SPLIT_FIELDS

Mark = Any  # a float (host seconds) or a torch.cuda.Event
INTERVAL_PHASES = ("forward_ms", "backward_ms", "optimizer_ms")
MAX_PENDING = 4  # CUDA steps whose events are not done yet; older ones are dropped, not waited on


@dataclass
class StepMarks:
    """What the hooks stamped during one step: its ends, the previous step's end (data wait
    starts there), and each forward, backward and optimizer interval."""

    step: int
    start: Mark
    left_before: Mark | None = None  # the end of the previous step's scope (None on the first)
    end: Mark | None = None
    intervals: dict[str, list[tuple[Mark, Mark]]] = field(
        default_factory=lambda: {name: [] for name in INTERVAL_PHASES})

    def marks(self) -> list[Mark]:
        out = [m for m in (self.left_before, self.start, self.end) if m is not None]
        for pairs in self.intervals.values():
            for a, b in pairs:
                out += (a, b)
        return out


def split_ms(marks: StepMarks, elapsed_ms: Callable[[Mark, Mark], float]) \
        -> dict[str, float | None]:
    """The five phase fields of one step (None: a phase no hook saw). ``other_ms`` is the step's
    span less the phases seen inside it, clamped at zero (see the module docstring)."""
    out: dict[str, float | None] = dict.fromkeys(SPLIT_FIELDS)
    if marks.left_before is not None:
        out["data_wait_ms"] = max(0.0, elapsed_ms(marks.left_before, marks.start))
    inside = 0.0
    for name in INTERVAL_PHASES:
        pairs = marks.intervals[name]
        if pairs:
            total = sum(max(0.0, elapsed_ms(a, b)) for a, b in pairs)
            out[name] = total
            inside += total
    if marks.end is not None:
        out["other_ms"] = max(0.0, elapsed_ms(marks.start, marks.end) - inside)
    return out


def host_elapsed_ms(a: float, b: float) -> float:
    return (b - a) * 1000.0


def event_elapsed_ms(a: Any, b: Any) -> float:
    return float(a.elapsed_time(b))


def event_ready(mark: Any) -> bool:
    return bool(mark.query())


class PendingSplits:
    """CUDA steps whose events may still be running: ``take`` answers the oldest step whose
    marks are all done (its split and its step number), never waiting; at most MAX_PENDING are
    kept (``dropped`` counts the ones given up: the host ran that far ahead of the device)."""

    def __init__(self, elapsed_ms: Callable[[Mark, Mark], float] = event_elapsed_ms,
                 ready: Callable[[Mark], bool] = event_ready) -> None:
        self.elapsed_ms, self.ready = elapsed_ms, ready
        self.queue: deque[StepMarks] = deque()
        self.dropped = 0

    def add(self, marks: StepMarks) -> None:
        self.queue.append(marks)
        while len(self.queue) > MAX_PENDING:
            self.queue.popleft()
            self.dropped += 1

    def take(self) -> tuple[int, dict[str, float | None]] | None:
        if not self.queue:
            return None
        oldest = self.queue[0]
        if not all(self.ready(m) for m in oldest.marks()):
            return None
        self.queue.popleft()
        return oldest.step, split_ms(oldest, self.elapsed_ms)
