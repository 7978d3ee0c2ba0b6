"""Which request of `memtop infer` gets a memory window (the `a` key, ``--attribute-request``)
and the window's events; the hooks and figures are probes/instruments/infer_attribution.py's.

A window measures one request's prefill step and its first decode step, then writes
``infer_attribution`` (or ``attribution_cancelled``) at once, so the request's later decode
steps stay undisturbed (probes/records/disturbed.py: the window's steps and the one after are
left out of the run's timings and peaks, as a training window's are). It never runs in request 1
(the warm-up, whose prefill peak sizes admission: the meter resets CUDA's peak counter) nor in a
request a profiler window traces (its hooks would be in the trace): a key's request waits for
the next request free of both; ``--attribute-request`` is checked up front
(trainer/infer_config.py).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from probes import records as R
from probes.instruments.infer_attribution import InferWindow
from probes.instruments.tensor_bytes import unique_bytes
from probes.monitor.session import RunSession
from trainer.infer_profile import PhaseProfiler
from trainer.model import GPT, KVCache


class InferMemoryWindows:
    """``want(request, trigger)`` / ``cancel(step, reason)`` from the request socket (at step
    boundaries, on the inference thread); ``begin``, ``measuring``, ``after_step`` and
    ``finish`` from the loop."""

    def __init__(self, session: RunSession, model: GPT, device: torch.device, amp: str,
                 shape: dict[str, Any], profiler: PhaseProfiler, requests: int,
                 at_request: int | None) -> None:
        self.session, self.model, self.device, self.amp = session, model, device, amp
        self.shape, self.profiler, self.requests = shape, profiler, requests
        self.wanted: tuple[int, str] | None = \
            (at_request, "attribute_request") if at_request else None
        self.window: InferWindow | None = None
        names = {id(m): n for n, m in model.named_modules()}
        self._kv_owner: list[str] = [names[id(block.attn)] for block in model.transformer.h]

    # requests from the socket ----------------------------------------------------------------
    def want(self, request: int, trigger: str) -> None:
        """A window in ``request`` or the first one after it that is free."""
        if self.window is None:
            self.wanted = (max(2, request), trigger)

    def cancel(self, step: int, reason: str) -> None:
        """A pending or open window ends without a table."""
        if self.window is not None or self.wanted is not None:
            self.window, self.wanted = None, None
            self.session.emit(R.ATTRIBUTION_CANCELLED, step, {"reason": reason})

    # the loop --------------------------------------------------------------------------------
    def begin(self, request: int, step: int, decode_steps: int) -> None:
        """Before the request's prefill (``step``): open the window when it is due here."""
        if self.wanted is None or request < self.wanted[0]:
            return
        if self.profiler.will_trace(request):  # (request 1 is never wanted: ``want``)
            return  # the next request, then
        trigger = self.wanted[1]
        self.wanted = None
        phases = (R.PREFILL, R.DECODE) if decode_steps > 0 else (R.PREFILL,)
        self.window = InferWindow(self.model, self.device, request, trigger, phases)
        self.session.emit(R.ATTRIBUTION_STARTED, step, {
            "warmup": 0, "steps": len(phases), "trigger": trigger,
            "modules_hooked": self.window.modules_hooked, "request": request})

    def measuring(self, phase: str, step: int) -> contextlib.AbstractContextManager[None]:
        """The step's forward under the window's hooks, when this step is one it measures."""
        window = self.window
        if window is None or phase in window.steps:
            return contextlib.nullcontext()
        return window.measuring(phase, step)

    def after_step(self, phase: str, step: int, cache: KVCache) -> None:
        """After a step: the window's event once its steps are measured."""
        window = self.window
        if window is None or phase not in window.steps or not window.measured_all:
            return
        self.window = None
        if window.error is not None:
            self.session.emit(R.ATTRIBUTION_CANCELLED, step, {
                "reason": f"the window's hooks failed: {window.error}"})
            return
        self.session.emit(R.INFER_ATTRIBUTION, step, window.event_data(
            self._kv_by_module(cache), {**self.shape, "context_tokens": cache.length},
            self.amp))

    def finish(self, step: int, stopped: bool) -> None:
        """The run's end: a window still wanted or open says why it made no table."""
        if self.window is not None or self.wanted is not None:
            target = self.window.request if self.window else self.wanted[0]  # type: ignore
            reason = ("the run stopped first" if stopped else
                      f"the run ended before request {target} (of {self.requests}) could "
                      "run one: request 1 and profiled requests have none")
            self.cancel(step, reason)

    def _kv_by_module(self, cache: KVCache) -> dict[str, int]:
        """Each layer's K and V storages, credited to that layer's attention module."""
        out: dict[str, int] = {}
        for layer, owner in enumerate(self._kv_owner):
            kept = [t for t in (cache.k[layer], cache.v[layer]) if t is not None]
            out[owner] = out.get(owner, 0) + unique_bytes(kept)[0]
        return out


__all__ = ["InferMemoryWindows"]
