"""Profiler windows of one inference phase each (tutorial exercise 7; pitfall 9: never one mixed
trace). Built on probes' ProfilerWindow (trace export, the top-ops table computed in a child
process, the profile_* events), with every event labelled with its phase.

A window never spans steps of the other phase: the prefill window is that one prefill step (the
earlier request was the warm-up), the decode window opens where the request has enough decode
steps left for warmup + active. Steps run inside record_function("prefill"/"decode") always, so
the labels are in every trace.
"""

from __future__ import annotations

import warnings
from typing import Any

from probes import records as R
from probes.instruments.hooks import RunContext, StepTensors
from probes.instruments.profwindow import ProfilerWindow
from probes.records import Event, StepSample


class PhaseProfiler:
    """One ProfilerWindow per phase; those of ``phases`` are armed for request ``at_request``,
    and ``rearm`` (the `p` key) arms both for a later request. ``maybe_open`` at each step
    boundary."""

    def __init__(self, phases: tuple[str, ...], decode_active: int, at_request: int) -> None:
        self.at_request = at_request  # the request whose steps are profiled
        self.decode_active = decode_active
        self.windows: dict[str, ProfilerWindow] = {
            R.PREFILL: ProfilerWindow(0, 0, 1),  # one step: the earlier request warmed up
            R.DECODE: ProfilerWindow(0, 1, decode_active)}
        self.opened: set[str] = set(R.PHASES) - set(phases)  # phases not armed count as done

    def setup(self, ctx: RunContext) -> None:
        for phase, window in self.windows.items():
            phase_ctx = RunContext(**{**ctx.__dict__, "emit": _labelled(ctx.emit, phase)})
            window.setup(phase_ctx)

    def maybe_open(self, step: int, phase: str, request: int, decode_left: int) -> None:
        """Before ``step`` (of ``phase``): open that phase's window when it is due and fits."""
        window = self.windows.get(phase)
        if window is None or phase in self.opened or request < self.at_request:
            return
        self.opened.add(phase)
        need = window.warmup + window.active
        if phase == R.DECODE and decode_left < need:
            window.ctx.emit(Event(R.PROFILE_CANCELLED, step, window.ctx.elapsed_s(), {
                "reason": f"the request has {decode_left} decode steps left and the window "
                          f"needs {need}; raise --new-tokens or lower --profile-active"}))
            return
        with warnings.catch_warnings():  # torch warns when a schedule has no warmup step
            warnings.simplefilter("ignore")
            window.open_window(step, trigger="profile_phase")

    def rearm(self, request: int) -> bool:
        """A `p` key / profile request: windows again for every phase, from ``request`` on;
        False while a window or its analysis is still busy."""
        if any(w.busy for w in self.windows.values()):
            return False
        self.at_request = request
        self.opened.clear()
        return True

    def will_trace(self, request: int) -> bool:
        """A window is tracing, or armed to open in ``request``."""
        if self.tracing:
            return True
        return request >= self.at_request and bool(set(self.windows) - self.opened)

    @property
    def tracing(self) -> bool:
        return any(w.tracing for w in self.windows.values())

    def end_step(self, step: int, sample: StepSample) -> None:
        for window in self.windows.values():
            window.end_step(step, StepTensors(None, None), sample)

    def close(self) -> None:
        for window in self.windows.values():
            window.close()


def _labelled(emit: Any, phase: str) -> Any:
    def emit_with_phase(event: Event) -> None:
        if event.event.startswith("profile"):
            event = Event(event.event, event.step, event.time_s, {**event.data, "phase": phase},
                          event.rank)
        emit(event)

    return emit_with_phase
