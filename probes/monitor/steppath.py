"""The Monitor's step path: what runs inside ``mon.step()`` and right after it, on the
training thread, every step (begin, the forward hook, the end's one read of the step's values,
the row, the hooks, the guard, the boundary's requests). Apart from monitor.py, where the run is
set up once and closed once, because this is the part whose cost is budgeted per step
(benchmarks: step_cost; docs/ARCHITECTURE.md)."""

from __future__ import annotations

import time
from typing import Any

import torch

from probes.instruments.hooks import StepTensors
from probes.monitor.scope import StepScope
from probes.monitor.setup import autocast_mode
from probes.monitor.stepvalues import non_finite_error
from probes.records import StepSample, freeze_step


class StepPath:
    """Mixed into Monitor; uses its session, memory probe, hooks, phases and guard."""

    def _on_forward(self: Any, module: Any, inputs: Any, output: Any) -> None:
        """The model's forward ended: count the micro-batch, fold the activation peak into
        the sampled CPU peak, and see which autocast dtype the loop uses."""
        if self._in_step is None:
            return  # an evaluation pass between steps
        if self.phases is not None:
            self.phases.forward_ended()  # before memtop's own work here
        self._micro += 1
        self.memory.observe_peak(budgeted=True)  # CPU: while it costs ≤ 0.2% of a step
        if self._amp == "auto":
            self._amp = autocast_mode(self.device) or "off"
            self.ctx.amp = self._amp
            self.session.recorder.add_to_config(resolved_amp=self._amp)  # once a run

    def _step_began(self: Any, scope: StepScope) -> None:
        self._in_step = scope
        self._micro = 0
        self.memory.begin_step()  # this step's peak starts here (CUDA: no sync)
        self._tracing = self.profiler is not None and self.profiler.tracing
        if self.phases is not None:
            self.phases.begin(scope.step, scope._t0)

    def _step_ended(self: Any, scope: StepScope) -> None:
        step, v = scope.step, scope._values
        phases = self.phases
        if phases is not None:
            phases.stop()  # CUDA: the step's end event, before the read that may sync on it
        queued = self._values.queue(v.loss, v.grad_norm, self._scale_watch.scale_tensor())
        disturbed = self.session.disturbance(step, self._tracing)  # records/disturbed.py
        early = self._before_wait
        if early:  # CUDA: host work while the device finishes the step (issue 45)
            reading = self.memory.read(count_peak=disturbed is None)
            self.recorder.drain_if_due()  # earlier rows' batch, before the wait, not after
        (loss, grad_norm, scale), synced = self._values.wait(queued)
        step_s = max(time.perf_counter() - scope._t0, 1e-9)
        split = phases.end(scope._t0 + step_s) if phases is not None else None
        if split is not None and phases.span_ms is not None:  # type: ignore[union-attr]
            # CUDA: the device's time for the step split_step names (this one when the read
            # synced), not the host's, which runs ahead of the device (issue 45)
            step_s = max(phases.span_ms / 1000.0, 1e-9)  # type: ignore[union-attr]
        if self.non_finite == "fail" and not self._scale_watch.enabled:
            error = non_finite_error(step, self._amp, loss, grad_norm)
            if error is not None:
                raise error
        self._scale_watch.update(scale)
        if not early:  # CPU: the heap read after the step's values (records.counts_toward_peak)
            reading = self.memory.read(count_peak=disturbed is None)
        if step == self.warmup_steps:
            self.memory.reset_peak()  # set-up and first-step allocations leave the run's peak
        row = self.session.step_draft(
            step, reading, step_s, amp=self._amp,
            tokens_in_step=v.tokens if v.tokens is not None else self.tokens_per_step,
            samples_in_step=v.samples if v.samples is not None else self.samples_per_step,
            loss=loss, scale=scale if self.scaler else None,
            skipped_steps=self._scale_watch.skipped, grad_norm=grad_norm,
            profiling=self._tracing, disturbed=disturbed, leak_active=self.leak_active,
            micro_batches=v.micro_batches or self._micro or None)
        if split is not None:  # phases.ROW_FIELDS, set on the draft in one statement
            (row.data_wait_ms, row.forward_ms, row.backward_ms, row.optimizer_ms, row.other_ms,
             row.split_step) = split
        scope.sample = sample = freeze_step(row)
        out = v.output
        out_bytes = out.numel() * out.element_size() if isinstance(out, torch.Tensor) else None
        # the row and the batched hooks' view of the step (no tensors held: they run late)
        fresh = self.session.workers_fresh
        self.recorder.publish_soon(sample, StepTensors(None, None, synced, out_bytes,
                                                       reading.heap_fresh,
                                                       reading.host_heap_bytes, fresh)
                                   if self._batched_hooks else None, drain=not early)
        if self._end_hooks:
            tensors = StepTensors(loss=v.loss if isinstance(v.loss, torch.Tensor) else None,
                                  output=out, synced=synced, output_bytes=out_bytes,
                                  heap_fresh=reading.heap_fresh,
                                  host_heap_bytes=reading.host_heap_bytes, workers=fresh)
            for hook in self._end_hooks:
                hook.end_step(step, tensors, sample)
        self.session.step = step
        self.guard.check(step, reading, sample.time_s, sample.workers_uss_bytes)
        if (self.max_steps == 0 or step < self.max_steps) and not self.control.stop_requested:
            self._boundary(step + 1)  # requests and pauses, before the loop's next step (once:
            # the loop's should_stop then finds it done)
        if self.phases is not None:
            self.phases.left()  # the loop's own time between steps starts here

    def _row_published(self: Any, sample: StepSample, tensors: StepTensors | None) -> None:
        """The recorder published a step's row (probes/runfolder/recorder.py publish_soon):
        the batched hooks' turn for that step."""
        if tensors is None:
            return
        for hook in self._batched_hooks:
            hook.end_step(sample.step, tensors, sample)

    def _step_failed(self: Any, step: int, exc: BaseException) -> None:
        if self.phases is not None:
            self.phases.forget_left()  # the next step's wait would hold this one
        if isinstance(exc, KeyboardInterrupt):
            return  # an interruption, not a failure: close() says so
        self.session.record_error(step, exc)

    # step boundaries: requests, pauses, the memory guard ------------------------------------
    def _boundary(self: Any, step: int) -> None:
        """Before ``step`` runs: the session acts on due requests, then waits while paused."""
        self._boundary_done = step
        self.session.boundary(step)
