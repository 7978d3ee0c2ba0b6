"""One optimizer step of a :class:`~probes.monitor.monitor.Monitor`: ``with mon.step() as s:``
enters each hook's step context (only where a hook has one), hands the step's values over
(``s.set``) and, at its end, lets the Monitor read and record the step."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from probes.monitor.stepvalues import StepValues
from probes.records import StepSample
from probes.records.errors import NonFiniteError


class StepScope:
    """One optimizer step, from ``with mon.step() as step:`` to its end."""

    def __init__(self, monitor: Any, step: int) -> None:  # the Monitor (monitor.py) owning it
        self.monitor = monitor
        self.step = step  # 1-based number of this optimizer step
        self.sample: StepSample | None = None  # set when the step has ended
        self._values = StepValues()
        self._stack: contextlib.ExitStack | None = None  # made only for a hook's real context
        self._t0 = 0.0

    def set(self, *, loss: Any = None, grad_norm: Any = None, output: torch.Tensor | None = None,
            tokens: int | None = None, samples: int | None = None,
            micro_batches: int | None = None) -> None:
        """Hand over what this step computed. Tensors are read once, after the step, at one
        wait for the device (no extra device sync); ``output`` (e.g. logits) only sizes leak hints;
        ``micro_batches`` replaces the count of the model's forward passes (a framework that
        calls the model's forward twice per batch, or not at all, knows its batches)."""
        v = self._values
        v.loss = loss if loss is not None else v.loss
        v.grad_norm = grad_norm if grad_norm is not None else v.grad_norm
        v.output = output if output is not None else v.output
        v.tokens = tokens if tokens is not None else v.tokens
        v.samples = samples if samples is not None else v.samples
        v.micro_batches = micro_batches if micro_batches is not None else v.micro_batches

    def __enter__(self) -> StepScope:
        self._t0 = time.perf_counter()
        try:
            for hook in self.monitor.context_hooks:  # most steps none wraps: no ExitStack
                cm = hook.step_context(self.step)
                if type(cm) is not contextlib.nullcontext:
                    self._stack = self._stack or contextlib.ExitStack()
                    self._stack.enter_context(cm)
        except BaseException:
            if self._stack is not None:
                self._stack.close()
            raise
        self.monitor._step_began(self)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        mon = self.monitor
        try:
            if self._stack is not None:
                self._stack.__exit__(exc_type, exc, tb)
        finally:
            mon._in_step = None
        if exc is not None:
            mon._step_failed(self.step, exc)
            return False
        try:
            mon._step_ended(self)
        except NonFiniteError as err:
            mon._step_failed(self.step, err)
            raise
        return False
