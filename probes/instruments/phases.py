"""Where each step goes: data wait, forward, backward, optimizer, other, in every step row.

``PhaseClock`` is armed by the Monitor on the loop's own model and optimizer, so a loop needs
nothing beyond ``with mon.step()``; every hook is registered once, none per step (the split
costs a few µs a step: python -m benchmarks run monitor_fixed_cost --split):

- forward: a forward pre-hook and a forward hook on the root model, one interval per call
  inside the step (gradient accumulation: the micro-batches' passes add up); a call while a
  backward runs (activation checkpointing recomputes) is not counted;
- backward: from the end of the model's forward to the end of the backward pass that follows
  (so a loss computed outside the model, usually a small share, falls in backward). The end:
  a post-accumulate-grad hook on the first and the last trainable parameter (one fires in any
  backward that reaches the model) queues an autograd final callback, which the engine runs
  once the whole pass is done (under DistributedDataParallel the callback queues itself once
  more, so it runs after DDP's own, which waits for the gradient all-reduce);
- optimizer: ``register_step_pre_hook`` / ``register_step_post_hook`` (a step GradScaler skips
  never calls it: no optimizer time that step);
- data wait: from the end of the previous step's ``with`` block (after memtop's own work on
  it) to the start of this one: the loader, logging, evaluation, whatever the loop did between.

On CPU the marks are ``time.perf_counter()``, summed as the hooks fire, and the split is the
step's own. On CUDA each mark is a ``torch.cuda.Event(enable_timing=True)`` from a ring made
once (phase_split.py ``EventRing``), recorded on the stream that was current when the clock was
made (looked up once, not per mark: ``Event.record()`` looks it up through torch's Python layer
each time, ~8 µs of an H200 step's 10 µs a mark, issue 45): the phases are device time (when
the GPU reached each boundary), read with ``query()``/``elapsed_time`` once done, never
synchronised. The step's end is stamped by ``stop()`` before the Monitor's one read of the
step's values, so a step that syncs there (a loop that hands over a CUDA loss) is read at its
own end; a step whose events are still running is read at a later step's end and that row says
which step it measured (``split_step``). The step's span on the device (start to end) is
``span_ms``: the row's step_ms on CUDA (the device's time for the step, not the host's, which
runs ahead of it). A phase no hook saw (the model not called inside the step, a compiled
function that fuses forward and backward, an optimizer without step hooks) is None, never a
made-up split. The arithmetic is probes/instruments/phase_split.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from probes.counters.device_index import device_index
from probes.instruments.phase_split import INTERVAL_PHASES, EventRing, PendingSplits, StepMarks
from probes.records import SPLIT_FIELDS

ROW_FIELDS = (*SPLIT_FIELDS, "split_step")  # what PhaseClock.end gives, in this order

_graph_task_id = torch._C._current_graph_task_id  # -1 outside a backward pass


class PhaseClock:
    """Stamps each step's phase boundaries through hooks (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, optimizer: Any, device: torch.device, *,
                 own_forward_hook: bool = True,
                 events: tuple[EventRing, PendingSplits] | None = None) -> None:
        """``own_forward_hook=False``: the caller's own forward hook calls ``forward_ended``
        (the Monitor's: one hook call less per forward). ``events``: the ring and queue of
        the event clock (CUDA's, made here on a CUDA device; a test passes its own, over
        events of a small class of its own, to run the event path on CPU)."""
        self.cuda = device.type == "cuda"
        self.ring: EventRing | None = None
        self._pending: PendingSplits | None = None
        self._mark: Callable[[], Any] = time.perf_counter
        if events is None and self.cuda:
            events = cuda_clock(device)
        if events is not None:
            self.ring, self._pending = events
            self._mark = self.ring.mark
        self.span_ms: float | None = None  # CUDA: the device span of the step end() measured
        self._ddp = type(model).__name__ == "DistributedDataParallel"
        self._marks: StepMarks | None = None  # CUDA: the step's events
        self._step: int | None = None  # the step in scope (None between steps)
        self._start: Any = None
        self._sums = [0.0, 0.0, 0.0]  # CPU: forward, backward, optimizer seconds so far
        self._seen = [False, False, False]
        self._left: Any = None  # the end of the previous step's scope
        self._fwd_start: Any = None
        self._fwd_end: Any = None  # the last forward's end: the next backward starts there
        self._opt_start: Any = None
        self._queued = False  # the backward's final callback is queued
        # the engine's queue_callback, looked up once (four attribute reads a step: issue 26)
        self._queue_callback = torch.autograd.Variable._execution_engine.queue_callback
        self._handles: list[Any] = [model.register_forward_pre_hook(self._forward_began)]
        if own_forward_hook:
            self._handles.append(model.register_forward_hook(
                lambda module, args, output: self.forward_ended()))
        params = [p for p in model.parameters() if p.requires_grad]
        for param in {id(p): p for p in params[:1] + params[-1:]}.values():
            register = getattr(param, "register_post_accumulate_grad_hook", None)
            if register is not None:
                self._handles.append(register(self._grad_accumulated))
        for name, fn in (("register_step_pre_hook", self._optimizer_began),
                         ("register_step_post_hook", self._optimizer_ended)):
            register = getattr(optimizer, name, None)
            if register is not None:
                self._handles.append(register(fn))

    # the step's scope (called by the Monitor) -------------------------------------------------
    def begin(self, step: int, started_s: float) -> None:
        """The step's scope began at ``started_s`` (perf_counter; the host clock's start, so
        the span is the step_ms the row reports; CUDA stamps an event now)."""
        self._step = step
        self._fwd_start = self._fwd_end = self._opt_start = None
        self._queued = False  # a backward that raised never ran its callback
        ring = self.ring
        if ring is not None:
            if self._marks is not None:  # a step that raised and was not forgotten
                ring.give_back(ring.take_issued())
                self._marks, self._left = None, None
            self._start = self._mark()
            self._marks = StepMarks(step, self._start, left_before=self._left)
            self._left = None  # the step's marks own it now
        else:
            self._start = started_s
            self._sums[:] = (0.0, 0.0, 0.0)
            self._seen[:] = (False, False, False)

    def stop(self) -> None:
        """CUDA: stamp the step's end now (before the Monitor reads the step's values: a read
        that syncs then completes the step's events, read at this step's end). CPU: nothing,
        the host clock's end is the one ``end`` is given."""
        marks = self._marks
        if marks is not None and marks.end is None and self._step is not None:
            marks.end = self._mark()

    def end(self, ended_s: float) -> tuple[float | int | None, ...] | None:
        """The step's ROW_FIELDS values: its phases (CUDA: those of the newest step whose events
        are done) and ``split_step``, the step they measured; None when there are none yet.
        ``ended_s``: the host clock's end of the step, the one step_ms is measured to, so on CPU
        the parts add up to step_ms exactly. A tuple, not a dict: the Monitor sets them on the
        row's draft in one statement (issue 28). On CUDA ``span_ms`` is then the measured
        step's device time (None when no step's events are done yet)."""
        step, self._step = self._step, None
        self.span_ms = None
        if step is None:
            return None
        pending = self._pending
        if pending is None:
            return self._host_split(step, ended_s)
        marks, self._marks = self._marks, None
        assert marks is not None and self.ring is not None
        if marks.end is None:
            marks.end = self._mark()
        marks.events = self.ring.take_issued()  # its own and the data wait's start, each once
        pending.add(marks)
        taken = pending.take()
        if taken is None:
            return None
        split_step, fields, self.span_ms = taken
        return (*(fields[name] for name in SPLIT_FIELDS), split_step)

    def _host_split(self, step: int, end: float) -> tuple[float | int | None, ...]:
        """CPU: the sums the hooks kept, as split_ms would make them from the same marks."""
        sums, seen, start, left = self._sums, self._seen, self._start, self._left
        inside = sums[0] + sums[1] + sums[2]
        return (max(0.0, (start - left) * 1000.0) if left is not None else None,
                sums[0] * 1000.0 if seen[0] else None,
                sums[1] * 1000.0 if seen[1] else None,
                sums[2] * 1000.0 if seen[2] else None,
                max(0.0, (end - start - inside) * 1000.0), step)

    def _interval(self, index: int, start: Any, end: Any) -> None:
        if self._pending is None:  # CPU: perf_counter is monotonic, end >= start
            self._sums[index] += end - start
            self._seen[index] = True
        elif self._marks is not None:
            self._marks.intervals[INTERVAL_PHASES[index]].append((start, end))

    def left(self) -> None:
        """The step's scope is over (memtop's own work on it included): data wait starts."""
        self._left = self._mark()  # on the event clock the next step owns it (take_issued)

    def forget_left(self) -> None:
        """Between steps something was not the loop's waiting (a pause), or the step raised:
        no data wait next; on the event clock what was marked since the last step's end
        goes back to the ring."""
        self._left = None
        ring = self.ring
        if ring is not None:
            ring.give_back(ring.take_issued())
            self._marks = None

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # hooks --------------------------------------------------------------------------------------
    def _forward_began(self, module: Any, args: Any) -> None:
        if self._step is not None and _graph_task_id() == -1:
            self._fwd_start = self._mark()  # not a recompute inside backward (checkpointing)

    def forward_ended(self) -> None:
        """The root model's forward returned (a forward hook)."""
        start = self._fwd_start
        if self._step is None or start is None:
            return
        self._fwd_start = None
        self._fwd_end = end = self._mark()
        self._interval(0, start, end)

    def _grad_accumulated(self, param: Any) -> None:
        if not self._queued and self._step is not None and self._fwd_end is not None:
            self._queued = True
            self._queue_callback(self._after_ddp if self._ddp else self._backward_done)

    def _after_ddp(self) -> None:
        self._queue_callback(self._backward_done)

    def _backward_done(self) -> None:
        self._queued = False
        start, self._fwd_end = self._fwd_end, None
        if self._step is not None and start is not None:
            self._interval(1, start, self._mark())

    def _optimizer_began(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._step is not None:
            self._opt_start = self._mark()

    def _optimizer_ended(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        start = self._opt_start
        if self._step is not None and start is not None:
            self._opt_start = None
            self._interval(2, start, self._mark())


def cuda_clock(device: torch.device) -> tuple[EventRing, PendingSplits]:
    """The CUDA split's ring of events, recorded on the stream current now on ``device``'s
    index, and its queue, both through the C methods under torch.cuda.Event's Python ones
    (record, query, elapsed_time: one Python frame less each; the public methods where a torch
    lacks them)."""
    index = device_index(device)
    stream = torch.cuda.current_stream(index)  # once: the stream the loop's work goes to
    base = getattr(torch._C, "_CudaEventBase", None)
    event_cls = torch.cuda.Event
    record = getattr(base, "record", None) or event_cls.record
    query = getattr(base, "query", None) or event_cls.query
    elapsed = getattr(base, "elapsed_time", None) or event_cls.elapsed_time
    ring = EventRing(lambda: event_cls(enable_timing=True), record, stream)
    pending = PendingSplits(elapsed, query, release=ring.give_back)
    return ring, pending
