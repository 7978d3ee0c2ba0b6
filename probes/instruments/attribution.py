"""A memory attribution window: which module holds the memory, for a few steps on request.

Like the profiler window (probes/instruments/profwindow.py), a key (`a`), a viewer's request
(``attribute``), ``--attribute-at STEP`` or ``Monitor.request_attribution()`` opens it at a step
boundary, and it closes itself: one warm-up step and ``steps`` measured steps, each run with
per-module hooks (probes/instruments/modmemory.py) that are put on at the step's start and
taken off at its end, whatever the step does (raises, is the last). Outside a window no hook
is on the model: the step path pays one call that returns at once.

At the end the measured steps' figures become one ``memory_attribution`` event: a row per
module (probes/records/attribution.py: bounded to MAX_ROWS, the event under 256 KiB), the
totals, and hints in the user's terms (probes/records/attribution_hints.py). The window's
steps are disturbed steps (probes/records/disturbed.py): left out of peaks, timing and the leak
detector. While a profiler window traces, a window waits its turn (the profiler's hooks would
be its forward peaks); the ledger leaves its measurement to the step after (both use
saved-tensor hooks, and only the innermost sees the tensors).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from probes import records as R
from probes.counters.memory import heap_counters
from probes.instruments.hooks import RunContext, StepHook, StepTensors
from probes.instruments.modmemory import ModuleMeter, PeakReader, StepFigures
from probes.instruments.tensor_bytes import unique_bytes
from probes.records import Event, StepSample
from probes.records.attribution import MAX_ROWS, fit_event, totals
from probes.records.attribution_hints import attribution_hints

# the forward peak's counter reads may cost this share of an undisturbed step (the window's
# target: a step at most 2x a plain one; benchmarks/cases/attribution/attribution_window.py);
# a step not seen yet counts as DEFAULT_STEP_S
PEAK_READ_SHARE = 0.3
DEFAULT_STEP_S = 0.05
PEAK_RULE_CPU = ("forward peak: the heap in use (mallinfo2) sampled at each module's entry and "
                 "exit and at each saved tensor, highest reading inside the module minus the "
                 "reading at its entry (a sampled peak)")
PEAK_RULE_CUDA = ("forward peak: the CUDA allocator's peak inside the module (reset at each "
                  "module hook) minus memory_allocated at its entry")


@dataclass
class _Window:
    first_step: int
    trigger: str
    meter: ModuleMeter
    index: int = 0  # window steps ended so far (warm-up included)
    measured: list[tuple[int, StepFigures, StepSample]] = field(default_factory=list)


class MemoryAttribution(StepHook):
    """``open_attribution(step)`` opens a window of ``warmup`` + ``steps`` steps (``at_steps``
    open one by themselves), ``cancel_attribution(step)`` ends it without a table.

    ``blocked``: set by the Monitor, true while a profiler window traces (a request then waits
    for its end). ``max_rows``: the event's row bound (probes/records/attribution.py).
    """

    def __init__(self, steps: int = 1, warmup: int = 1, *,
                 at_steps: list[int] | tuple[int, ...] = (), max_rows: int = MAX_ROWS) -> None:
        if steps <= 0 or warmup < 0:
            raise ValueError("an attribution window needs steps > 0 and warmup >= 0")
        self.steps, self.warmup, self.max_rows = steps, warmup, max_rows
        self._pending_at = sorted(set(at_steps))
        self._wanted: str | None = None  # a request waiting for the profiler's window to end
        self._window: _Window | None = None
        self._running: int | None = None  # the step whose hooks are on now
        self._hooked: int | None = None  # the step that ran to its end with the hooks on
        self._step = 0
        self._plain_forward_ms: float | None = None  # the last undisturbed step's forward
        self._plain_step_s: float | None = None  # and its whole step (the read budget)
        self.blocked: Callable[[], bool] = lambda: False
        self.windows_done = 0
        self.last: dict[str, Any] | None = None  # the last event's data (tests, the bench)

    def setup(self, ctx: RunContext) -> None:
        super().setup(ctx)
        self.reader = PeakReader(ctx.device)
        # CPU: the heap torch and Python held before the first step (as the ledger's "runtime
        # heap at start"): the table's %peak is of the step's peak above it
        self.runtime_heap: int | None = None
        if ctx.device.type != "cuda":
            heap = heap_counters()
            if heap is not None:
                self.runtime_heap = max(0, heap[0] - unique_bytes(ctx.model.parameters())[0]
                                        - unique_bytes(ctx.model.buffers())[0])

    @property
    def attributing(self) -> bool:
        """A window is open: its steps run with the per-module hooks."""
        return self._window is not None

    @property
    def busy(self) -> bool:
        return self._window is not None or self._wanted is not None

    # requests ----------------------------------------------------------------------------
    def open_attribution(self, step: int, trigger: str = "request") -> bool:
        """Open a window at the boundary before ``step`` (or as soon as no profiler window
        traces); False when one is open or waiting already."""
        if self.busy:
            return False
        self._wanted = trigger
        self._maybe_open(step)
        return True

    def cancel_attribution(self, step: int, reason: str = "cancelled by user") -> bool:
        """End the open (or waiting) window without a table; False when there is none. Called
        mid-step, the step's hooks still come off at its end and it counts nothing."""
        if self._window is None and self._wanted is None:
            return False
        self._window, self._wanted = None, None
        # mid-step: that step is the window's last (probes/records/disturbed.py); else the
        # step before the boundary it is acted on at
        at = self._running if self._running is not None else max(step - 1, 0)
        self._emit(R.ATTRIBUTION_CANCELLED, at, {"reason": reason})
        return True

    def _maybe_open(self, step: int) -> None:
        if self._wanted is None or self._window is not None or self.blocked():
            return
        trigger, self._wanted = self._wanted, None
        try:
            meter = ModuleMeter(self.ctx.model, self.ctx.optimizer, self.reader)
            meter.plan_reads(self.reader.read_cost_s(),
                             PEAK_READ_SHARE * (self._plain_step_s or DEFAULT_STEP_S))
        except Exception as exc:  # an instrument never takes the training down
            self._emit(R.ATTRIBUTION_CANCELLED, max(step - 1, 0),
                       {"reason": f"could not hook the model: {type(exc).__name__}: {exc}"})
            return
        self._window = _Window(step, trigger, meter)
        self._emit(R.ATTRIBUTION_STARTED, step, {
            "warmup": self.warmup, "steps": self.steps, "trigger": trigger,
            "modules_hooked": meter.modules_hooked})

    # the step ------------------------------------------------------------------------------
    def step_context(self, step: int) -> contextlib.AbstractContextManager[Any]:
        self._step = step
        if self._pending_at and self._pending_at[0] <= step and not self.busy:
            while self._pending_at and self._pending_at[0] <= step:  # one window serves all
                self._pending_at.pop(0)
            self._wanted = "attribute_at"
        if self._wanted is not None:
            self._maybe_open(step)
        if self._window is None:
            return contextlib.nullcontext()
        return self._measure(step, self._window.meter)

    @contextlib.contextmanager
    def _measure(self, step: int, meter: ModuleMeter) -> Iterator[None]:
        """The step with the meter's hooks on; they come off however the step ends."""
        try:
            meter.install()
            saving = meter.saving()
            saving.__enter__()
        except Exception as exc:
            meter.remove()
            self.cancel_attribution(step, f"could not hook the model: {type(exc).__name__}: "
                                          f"{exc}")
            yield
            return
        self._running, self._hooked = step, None
        try:
            yield
            self._hooked = step
        finally:
            self._running = None
            with contextlib.suppress(Exception):
                saving.__exit__(None, None, None)
            meter.remove()

    def end_step(self, step: int, tensors: StepTensors, sample: StepSample) -> None:
        win, hooked, self._hooked = self._window, self._hooked, None
        if win is None or hooked != step:
            if win is None and sample.disturbed is None:
                if sample.forward_ms is not None:
                    self._plain_forward_ms = sample.forward_ms  # the hint's "today's forward"
                self._plain_step_s = sample.step_ms / 1000.0
            return
        figures = win.meter.take()
        if win.meter.error is not None:
            self.cancel_attribution(step + 1, f"the window's hooks failed: {win.meter.error}")
            return
        win.index += 1
        if win.index > self.warmup:
            win.measured.append((step, figures, sample))
        if len(win.measured) >= self.steps:
            self._finish(step, tensors)
        elif step == self.ctx.max_steps:  # so its event precedes run_finished
            self._finish(step, tensors, partial=True)

    def close(self) -> None:
        if self._window is not None:
            if self._window.measured:
                self._finish(self._step, None, partial=True)
            else:
                self.cancel_attribution(self._step + 1, "the run ended before the window's "
                                                        "measured step")
        self._wanted = None

    # the event -----------------------------------------------------------------------------
    def _finish(self, step: int, tensors: StepTensors | None, partial: bool = False) -> None:
        win, self._window = self._window, None
        if win is None:
            return
        t0 = time.perf_counter()
        try:
            data = self._build(win, tensors)
        except Exception as exc:
            self._emit(R.ATTRIBUTION_CANCELLED, step,
                       {"reason": f"the table could not be built: {type(exc).__name__}: {exc}"})
            return
        if partial:
            data["partial"] = True
        data["build_ms"] = round((time.perf_counter() - t0) * 1000.0, 3)
        self.windows_done += 1
        self.last = data
        self._emit(R.MEMORY_ATTRIBUTION, step, data)

    def _build(self, win: _Window, tensors: StepTensors | None) -> dict[str, Any]:
        meter = win.meter
        step, figures, sample = max(  # the measured step that kept the most activations
            win.measured, key=lambda m: (sum(f.activations for f in m[1].modules.values())
                                         + m[1].unattributed, m[0]))
        peaks: dict[str, int] = {}
        for _, fig, _ in win.measured:
            for name, peak in fig.peaks.items():
                peaks[name] = max(peaks.get(name, 0), peak)
        names = (set(meter.param_bytes) | set(figures.grads) | set(figures.optimizer)
                 | set(figures.modules) | set(figures.calls))
        rows = []
        for name in sorted(names):
            mod = figures.modules.get(name)
            rows.append({
                "module": name, "params_bytes": meter.param_bytes.get(name, 0),
                "grads_bytes": figures.grads.get(name, 0),
                "optimizer_bytes": figures.optimizer.get(name, 0),
                "activations_bytes": mod.activations if mod else 0,
                "forward_peak_bytes": peaks.get(name),
                "calls": figures.calls.get(name, 0),
                "weight_copies_bytes": mod.weight_copies if mod else 0,
                "scores_bytes": mod.scores if mod else 0,
                "input_bytes": figures.inputs.get(name, 0),
                "forward_ms": round(figures.forward_s.get(name, 0.0) * 1000.0, 4),
                "checkpointed": bool(mod and mod.checkpointed)})
        sums = totals(rows)
        cfg = self.ctx.config
        seq, batch = cfg.get("seq_len"), cfg.get("batch_size")
        out = tensors.output if tensors is not None else None
        if out is not None and out.dim() >= 2 and not isinstance(seq, int):
            batch, seq = int(out.shape[0]), int(out.shape[1])
        highs = [h for h in (figures.step_high, sample.step_peak_allocated_bytes)
                 if isinstance(h, int)]
        data: dict[str, Any] = {
            "steps": [m[0] for m in win.measured], "warmup_steps": self.warmup,
            "trigger": win.trigger, "micro_batches": figures.passes,
            "modules": rows, "unattributed_bytes": figures.unattributed,
            "params_total_bytes": sums["params_bytes"],
            "grads_total_bytes": sums["grads_bytes"],
            "optimizer_total_bytes": sums["optimizer_bytes"],
            "activations_total_bytes": sums["activations_bytes"] + figures.unattributed,
            "weight_copies_bytes": sums["weight_copies_bytes"],
            "checkpoint_inputs_bytes": sum(r["activations_bytes"] for r in rows
                                           if r["checkpointed"]),
            "step_peak_bytes": max(highs) if highs else None,
            "runtime_heap_bytes": self.runtime_heap,
            "forward_ms": round(figures.forward_s.get("", 0.0) * 1000.0, 3),
            "plain_forward_ms": self._plain_forward_ms,
            "window_step_ms": sample.step_ms,
            "hook_ms": round(figures.hook_s * 1000.0, 3),
            "seq_len": seq if isinstance(seq, int) else None,
            "batch_size": batch if isinstance(batch, int) else None,
            "model_class": type(self.ctx.model).__name__,
            "optimizer_class": type(self.ctx.optimizer).__name__,
            "modules_hooked": meter.modules_hooked, "counter": self.reader.source,
            "peak_depth": meter.peak_depth,
            "peak_rule": PEAK_RULE_CUDA if self.reader.cuda else PEAK_RULE_CPU,
            "device": str(self.ctx.device), "amp": self.ctx.amp}
        if meter.peak_depth is not None:
            data["peak_rule"] += (f"; modules deeper than depth {meter.peak_depth} were not "
                                  "read (their reads would have cost over "
                                  f"{PEAK_READ_SHARE:.0%} of a step): n/a")
        data["hints"] = attribution_hints(data)
        before = len(rows)
        fit_event(data)
        data["rows_folded"] = before - len(data["modules"])
        return data

    def _emit(self, name: str, step: int, data: dict[str, Any]) -> None:
        self.ctx.emit(Event(name, step, self.ctx.elapsed_s(), data))
