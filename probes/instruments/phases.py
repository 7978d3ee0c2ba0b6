"""Where each step goes: data wait, forward, backward, optimizer, other, in every step row.

``PhaseClock`` is armed by the Monitor on the loop's own model and optimizer, so a loop needs
nothing beyond ``with mon.step()``:

- forward: a forward pre-hook and a forward hook on the root model, one interval per call
  inside the step (gradient accumulation: the micro-batches' passes add up); a call while a
  backward runs (activation checkpointing recomputes) is not counted;
- backward: the forward hook puts a tensor hook on the model's outputs that need a gradient;
  the first to fire starts the backward, and it queues an autograd final callback, which the
  engine runs once the whole backward pass is done (under DistributedDataParallel the callback
  queues itself once more, so it runs after DDP's own one, which waits for the gradient
  all-reduce);
- optimizer: ``register_step_pre_hook`` / ``register_step_post_hook`` (a step GradScaler skips
  never calls it: no optimizer time that step);
- data wait: from the end of the previous step's ``with`` block (after memtop's own work on
  it) to the start of this one: the loader, logging, evaluation, whatever the loop did between.

On CPU the marks are ``time.perf_counter()`` and the split is the step's own. On CUDA each mark
is a ``torch.cuda.Event(enable_timing=True)`` recorded on the current stream: the phases are
device time (when the GPU reached each boundary), read with ``query()``/``elapsed_time`` once
done, never synchronised; a step whose events are still running when it ends is read at a later
step's end and that row says which step it measured (``split_step``). A phase no hook saw (the
model not called inside the step, a compiled function that fuses forward and backward, an
optimizer without step hooks) is None, never a made-up split. The arithmetic is
probes/instruments/phase_split.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from probes.instruments.phase_split import (
    PendingSplits,
    StepMarks,
    host_elapsed_ms,
    split_ms,
)

MAX_OUTPUT_TENSORS = 4  # outputs hooked per forward (a tuple of logits and loss, a ModelOutput)


def output_tensors(output: Any) -> list[torch.Tensor]:
    """The model's top-level outputs that will get a gradient (a tensor, a tuple or list, a dict
    or a ModelOutput), at most MAX_OUTPUT_TENSORS."""
    if isinstance(output, torch.Tensor):
        items: Any = (output,)
    elif isinstance(output, dict):
        items = output.values()
    elif isinstance(output, (tuple, list)):
        items = output
    else:
        return []
    return [t for t in items if isinstance(t, torch.Tensor) and t.requires_grad][
        :MAX_OUTPUT_TENSORS]


class PhaseClock:
    """Stamps each step's phase boundaries through hooks (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, optimizer: Any, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._mark: Callable[[], Any] = self._event_mark if self.cuda else time.perf_counter
        self._pending = PendingSplits() if self.cuda else None
        self._ddp = type(model).__name__ == "DistributedDataParallel"
        self._marks: StepMarks | None = None
        self._left: Any = None  # the end of the previous step's scope
        self._fwd_start: Any = None
        self._bwd_start: Any = None  # set while a backward runs
        self._opt_start: Any = None
        self._handles: list[Any] = [
            model.register_forward_pre_hook(self._forward_began),
            model.register_forward_hook(self._forward_ended),
        ]
        for name, fn in (("register_step_pre_hook", self._optimizer_began),
                         ("register_step_post_hook", self._optimizer_ended)):
            register = getattr(optimizer, name, None)
            if register is not None:
                self._handles.append(register(fn))

    @staticmethod
    def _event_mark() -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    # the step's scope (called by the Monitor) -------------------------------------------------
    def begin(self, step: int, started_s: float) -> None:
        """The step's scope began at ``started_s`` (perf_counter; the host clock's start, so
        the span is the step_ms the row reports; CUDA stamps an event now)."""
        start = self._mark() if self.cuda else started_s
        self._marks = StepMarks(step, start, left_before=self._left)
        self._fwd_start = self._bwd_start = self._opt_start = None

    def end(self) -> dict[str, float | int | None]:
        """The step's fields: its phases (CUDA: those of the oldest step whose events are done)
        and ``split_step``, the step they measured."""
        marks, self._marks = self._marks, None
        if marks is None:
            return {}
        marks.end = self._mark()
        if self._pending is None:
            return {**split_ms(marks, host_elapsed_ms), "split_step": marks.step}
        self._pending.add(marks)
        taken = self._pending.take()
        if taken is None:
            return {}
        step, fields = taken
        return {**fields, "split_step": step}

    def left(self) -> None:
        """The step's scope is over (memtop's own work on it included): data wait starts."""
        self._left = self._mark()

    def forget_left(self) -> None:
        """Between steps something was not the loop's waiting (a pause): no data wait next."""
        self._left = None

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # hooks --------------------------------------------------------------------------------------
    def _forward_began(self, module: Any, args: Any) -> None:
        if self._marks is not None and self._bwd_start is None:
            self._fwd_start = self._mark()

    def _forward_ended(self, module: Any, args: Any, output: Any) -> None:
        marks, start = self._marks, self._fwd_start
        if marks is None or start is None:
            return
        self._fwd_start = None
        marks.intervals["forward_ms"].append((start, self._mark()))
        for tensor in output_tensors(output):
            tensor.register_hook(self._backward_reached)

    def _backward_reached(self, grad: Any) -> None:
        if self._bwd_start is None and self._marks is not None:
            self._bwd_start = self._mark()
            torch.autograd.Variable._execution_engine.queue_callback(
                self._after_ddp if self._ddp else self._backward_done)

    def _after_ddp(self) -> None:
        torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)

    def _backward_done(self) -> None:
        marks, start = self._marks, self._bwd_start
        self._bwd_start = None
        if marks is not None and start is not None:
            marks.intervals["backward_ms"].append((start, self._mark()))

    def _optimizer_began(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._marks is not None:
            self._opt_start = self._mark()

    def _optimizer_ended(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        marks, start = self._marks, self._opt_start
        if marks is not None and start is not None:
            self._opt_start = None
            marks.intervals["optimizer_ms"].append((start, self._mark()))

