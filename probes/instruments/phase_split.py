"""The arithmetic of the step split, free of hooks and devices, so it is tested on CPU for both
clocks: a step's marks (host ``perf_counter`` seconds on CPU, CUDA events on CUDA) turned into
the five phase fields of a step row and the step's span on that clock, the queue that reads
CUDA events when they are done, and the ring of events the marks are recorded from.

A mark is whatever the clock stamps: the split only asks ``elapsed_ms(a, b)`` of two marks and,
for a queue of CUDA steps, ``ready(mark)`` (``Event.query()``: never a sync) of the step's last
mark, its end: events recorded on one stream complete in the order they were recorded, so when
the end is done every earlier mark of the step is (one query a step, issue 45). Why ``other_ms``
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
RING_EVENTS = 64  # events made up front: ~8 a step (more with accumulation) × MAX_PENDING + 1


class EventRing:
    """Timing events made once and recorded again and again (issue 45): ``mark()`` records a
    free one on the stream given once (never looked up per mark) and hands it out;
    ``give_back`` returns a step's events once they are read, or given up. When every event is
    out (many micro-batches a step), one more is made and kept (``made`` counts them).

    ``new_event()`` makes an event, ``record(event, stream)`` records it: on CUDA
    ``torch.cuda.Event(enable_timing=True)`` and the C method under ``Event.record``; any class
    with record / query / elapsed_time does on CPU (tests)."""

    def __init__(self, new_event: Callable[[], Any], record: Callable[[Any, Any], Any],
                 stream: Any, size: int = RING_EVENTS) -> None:
        self._new, self._record, self._stream = new_event, record, stream
        self._free: list[Any] = [new_event() for _ in range(size)]
        self.made = size
        self.issued: list[Any] = []  # handed out since the last take_issued, in order

    @property
    def free(self) -> int:
        return len(self._free)

    def mark(self) -> Any:
        free = self._free
        if free:
            event = free.pop()
        else:
            event = self._new()
            self.made += 1
        self._record(event, self._stream)
        self.issued.append(event)
        return event

    def take_issued(self) -> list[Any]:
        """The events handed out since the last call, each once: a step's to give back."""
        issued, self.issued = self.issued, []
        return issued

    def give_back(self, events: list[Any]) -> None:
        self._free.extend(events)


@dataclass(slots=True)
class StepMarks:
    """What the hooks stamped during one step: its ends, the previous step's end (data wait
    starts there), and each forward, backward and optimizer interval; ``events``, when the
    clock kept them, every event the step owns (its ring's take_issued: each once)."""

    step: int
    start: Mark
    left_before: Mark | None = None  # the end of the previous step's scope (None on the first)
    end: Mark | None = None
    intervals: dict[str, list[tuple[Mark, Mark]]] = field(
        default_factory=lambda: {name: [] for name in INTERVAL_PHASES})
    events: list[Mark] | None = None

    def marks(self) -> list[Mark]:
        """Every mark of the step, each once (a forward's end is also the backward's start)."""
        if self.events is not None:
            return self.events
        out = {id(m): m for m in (self.left_before, self.start, self.end) if m is not None}
        for pairs in self.intervals.values():
            for a, b in pairs:
                out[id(a)], out[id(b)] = a, b
        return list(out.values())


def split_ms(marks: StepMarks, elapsed_ms: Callable[[Mark, Mark], float]) \
        -> dict[str, float | None]:
    """The five phase fields of one step (None: a phase no hook saw). ``other_ms`` is the step's
    span less the phases seen inside it, clamped at zero (see the module docstring)."""
    return split_and_span(marks, elapsed_ms)[0]


def split_and_span(marks: StepMarks, elapsed_ms: Callable[[Mark, Mark], float]) \
        -> tuple[dict[str, float | None], float | None]:
    """``split_ms`` and ``span_ms`` in one pass (the CUDA step path reads both each step)."""
    out: dict[str, float | None] = dict.fromkeys(SPLIT_FIELDS)
    start = marks.start
    if marks.left_before is not None:
        wait = elapsed_ms(marks.left_before, start)
        out["data_wait_ms"] = wait if wait > 0.0 else 0.0
    inside = 0.0
    for name, pairs in marks.intervals.items():
        if pairs:
            total = 0.0
            for a, b in pairs:
                part = elapsed_ms(a, b)
                if part > 0.0:
                    total += part
            out[name] = total
            inside += total
    span = None
    if marks.end is not None:
        span = elapsed_ms(start, marks.end)
        if span < 0.0:
            span = 0.0
        other = span - inside
        out["other_ms"] = other if other > 0.0 else 0.0
    return out, span


def host_elapsed_ms(a: float, b: float) -> float:
    return (b - a) * 1000.0


def event_elapsed_ms(a: Any, b: Any) -> float:
    return float(a.elapsed_time(b))


def event_ready(mark: Any) -> bool:
    return bool(mark.query())


def span_ms(marks: StepMarks, elapsed_ms: Callable[[Mark, Mark], float]) -> float | None:
    """The step's span on its clock, start to end (CUDA: the device's time for the step: the
    step row's step_ms on CUDA, issue 45); None without an end."""
    if marks.end is None:
        return None
    return max(0.0, elapsed_ms(marks.start, marks.end))


class PendingSplits:
    """CUDA steps whose events may still be running: ``take`` answers the newest step whose
    end is done (its step number, its split and its span), never waiting; at most MAX_PENDING
    are kept (``dropped`` counts the ones given up: the host ran that far ahead of the device).
    A step read or given up hands its events to ``release`` (the ring they came from)."""

    def __init__(self, elapsed_ms: Callable[[Mark, Mark], float] = event_elapsed_ms,
                 ready: Callable[[Mark], bool] = event_ready,
                 release: Callable[[list[Mark]], None] | None = None) -> None:
        self.elapsed_ms, self.ready, self.release = elapsed_ms, ready, release
        self.queue: deque[StepMarks] = deque()
        self.dropped = 0
        self.superseded = 0  # done steps left out for a newer done one (take)

    def add(self, marks: StepMarks) -> None:
        self.queue.append(marks)
        while len(self.queue) > MAX_PENDING:
            self._done_with(self.queue.popleft())
            self.dropped += 1

    def take(self) -> tuple[int, dict[str, float | None], float | None] | None:
        """The newest step whose end is done, after every older one (one query a step: the
        marks of one stream complete in order); the older ones done with it are left out
        (``superseded``), so a loop that syncs again is read at its own step at once."""
        queue, newest = self.queue, None
        while queue:
            marks = queue[0]
            if not self.ready(marks.end if marks.end is not None else marks.start):
                break
            queue.popleft()
            if newest is not None:
                self._done_with(newest)
                self.superseded += 1
            newest = marks
        if newest is None:
            return None
        fields, span = split_and_span(newest, self.elapsed_ms)
        self._done_with(newest)
        return newest.step, fields, span

    def _done_with(self, marks: StepMarks) -> None:
        if self.release is not None:
            self.release(marks.marks())
