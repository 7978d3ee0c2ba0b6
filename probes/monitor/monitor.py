"""Watch any training loop: the public API of memtop's probes.

    from probes import Monitor

    with Monitor(model, optimizer, scaler=scaler, tokens_per_step=B * T) as mon:
        for x, y in batches:
            with mon.step() as step:          # one optimizer step (all its micro-batches)
                with torch.autocast("cuda", torch.float16):
                    loss = loss_fn(model(x), y)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                step.set(loss=loss)           # optional: grad_norm=, output=, tokens=
            if mon.should_stop:               # a viewer asked to stop (never killed from here)
                break

The run folder, counters, profiler window, leak watch, ledger and report are the same as for
`memtop train`, whose trainer is itself a user of this class; `memtop view RUN` follows the
folder live from another terminal and sends requests through the run's socket. Everything runs
on the caller's thread except the NVML poller, the workers' sampler (the loop's DataLoader
workers, read from /proc) and the socket listener, which never touch the step path; all stop
on close() and at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from probes.control.requests import RunControl
from probes.control.unix_socket import ControlServer
from probes.counters.device_index import indexed_device
from probes.counters.nvml import NvmlPoller
from probes.instruments.attribution import MemoryAttribution
from probes.instruments.hints import HintWatch
from probes.instruments.hooks import GPTShape, StepHook, overriding
from probes.instruments.ledger import Ledger
from probes.instruments.phases import PhaseClock
from probes.monitor.forward_hook import ForwardCounter
from probes.monitor.guard import MemoryGuard
from probes.monitor.scope import StepScope
from probes.monitor.session import RunSession
from probes.monitor.setup import (
    check_args,
    default_hooks,
    env_rank,
    env_world_size,
    make_folder,
    metrics_endpoint,
)
from probes.monitor.steppath import StepPath
from probes.monitor.stepvalues import (
    ScalerWatch,
    StepValueReader,
)
from probes.records import STEP_CLOCK_CUDA, STEP_CLOCK_HOST, Event
from probes.records.errors import MonitorArgumentError, MonitorStateError
from probes.runfolder.recorder import Sink

__all__ = ["Monitor", "StepScope", "default_hooks"]


class Monitor(StepPath):
    """Instruments one process's training loop; see the module docstring for the loop.

    Only ``model`` and ``optimizer`` are needed. Keywords: ``scaler`` (GradScaler: scale and
    skipped steps); ``tokens_per_step`` or ``samples_per_step`` (throughput; steps/s otherwise);
    ``run_dir`` (a fresh ``<time>-<id>/`` folder is made under it) or ``run_folder`` (this exact,
    existing folder); ``config`` (written to config.json); ``amp`` ("off", "bf16", "fp16"; seen
    in the forward pass when not given); ``warmup_steps`` (peaks reset after them, instruments
    ignore them); ``max_steps``; ``profile_at`` steps and the window's ``profile_schedule``
    (wait, warmup, active); ``attribute_at`` steps and ``attribute_steps`` (a memory attribution
    window: per-module bytes, probes/instruments/attribution.py; ``request_attribution()`` opens
    one); ``leak_watch``, ``ledger``, ``profiler``, ``attribution``, ``listen`` (the request
    socket) to switch parts off; ``max_memory_bytes`` (stop before that); ``flops_per_token``
    (MFU in the report; unknown otherwise); ``write_report`` at close; ``requests`` (request
    kinds this class cannot do itself, with handlers; announced in run_started); ``non_finite``
    ("record": a step whose loss or gradient norm is inf/nan is written as measured; "fail":
    without a GradScaler such a step raises NonFiniteError from its ``with`` block and is
    recorded as the run's error, not as a sample); ``memory_history`` (CUDA: record
    allocations with Python stacks for the OOM snapshot; costs µs per allocation, off by
    default, probes/counters/cudamem.py); ``step_split`` (data wait, forward, backward,
    optimizer in every row: probes/instruments/phases.py); ``workers_sample_s`` (how often a
    thread reads the loop's child processes, its DataLoader workers, from /proc: every row
    records the latest reading, the leak watch and the guard count them; None: off;
    probes/counters/workers.py); ``session`` (a RunSession not
    opened yet, built by a writer that needs its recorder before the loop starts, as memtop's
    trainer does; its run folder, rank, config and control are then the session's);
    ``metrics_port`` (serve /metrics for Prometheus on ``metrics_bind``, 127.0.0.1 by
    default, from a thread of its own: probes/export; under torchrun only local rank 0 serves,
    every rank of its machine; 0 picks a free port, ``metrics_url`` says which).
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 scaler: torch.amp.GradScaler | None = None, tokens_per_step: int | None = None,
                 samples_per_step: int | None = None, run_dir: str | os.PathLike[str] = "runs",
                 run_folder: str | os.PathLike[str] | None = None,
                 config: Mapping[str, Any] | None = None, amp: str | None = None,
                 warmup_steps: int = 5, max_steps: int = 0, profile_at: Iterable[int] = (),
                 profile_schedule: tuple[int, int, int] = (1, 1, 3),
                 profile_memory: bool = False, profile_record_shapes: bool = False,
                 leak_watch: bool = True, ledger: bool = True, profiler: bool = True,
                 attribution: bool = True, attribute_at: Iterable[int] = (),
                 attribute_steps: int = 1, listen: bool = True, max_memory_bytes: int | None = None,
                 flops_per_token: float | None = None, model_shape: GPTShape | None = None,
                 write_report: bool = True, sinks: Iterable[Sink] = (),
                 control: RunControl | None = None, session: RunSession | None = None,
                 extra_hooks: Iterable[StepHook] = (), rank: int | None = None,
                 requests: Mapping[str, Callable[[int], object]] | None = None,
                 non_finite: str = "record", memory_history: bool = False,
                 step_split: bool = True, metrics_port: int | None = None,
                 metrics_bind: str = "127.0.0.1", workers_sample_s: float | None = 1.0) -> None:
        device = indexed_device(check_args(model, optimizer, scaler, tokens_per_step,
                                           samples_per_step, amp, warmup_steps, max_steps))
        if workers_sample_s is not None and (isinstance(workers_sample_s, bool) or not isinstance(
                workers_sample_s, (int, float)) or not workers_sample_s > 0):
            raise MonitorArgumentError(f"workers_sample_s must be a number of seconds above 0 "
                                       f"(or None: off), got {workers_sample_s!r}")
        if non_finite not in ("record", "fail"):
            raise MonitorArgumentError(f"non_finite must be 'record' or 'fail', got "
                                       f"{non_finite!r}")
        if session is not None and control is not None and control is not session.control:
            raise MonitorArgumentError("pass control= or session=, not both: a session has "
                                       "its own control")
        self.non_finite = non_finite
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.device = device
        self.tokens_per_step, self.samples_per_step = tokens_per_step, samples_per_step
        self.warmup_steps, self.max_steps = warmup_steps, max_steps
        self.max_memory_bytes = max_memory_bytes
        self.write_report_at_close = write_report
        endpoint = metrics_endpoint(metrics_port, metrics_bind)  # bound before any folder
        if session is None:
            cfg = dict(config or {})
            cfg.setdefault("monitor", {"warmup_steps": warmup_steps, "max_steps": max_steps,
                                       "tokens_per_step": tokens_per_step,
                                       "samples_per_step": samples_per_step,
                                       "model": type(model).__name__})
            try:
                session = RunSession(make_folder(run_dir, run_folder),
                                     rank=rank if rank is not None else env_rank(),
                                     sinks=sinks, config=cfg, control=control)
            except BaseException:
                if endpoint is not None:
                    endpoint.close()
                raise
        else:
            session.recorder.sinks.extend(sinks)
        self.session = session
        self.control, self.recorder = session.control, session.recorder
        self.run_dir, self.rank = session.run_dir, session.rank
        self.closed = False
        self._in_step: StepScope | None = None
        self._amp = amp or "auto"
        self._boundary_done = 0  # the step whose boundary work is done
        self._scale_watch = ScalerWatch(scaler)
        self._values = StepValueReader()  # its host slots are made once (stepvalues.py)
        # CUDA: the allocator is read and the rows' batch published before the step's one wait
        # (both are host bookkeeping, done by then); CPU keeps its order (the heap counter)
        self._before_wait = device.type == "cuda"
        self._micro = 0
        self._tracing = False
        self.leak_active = False  # set by a loop that runs memtop's leak demo
        self.memory = session.open(device, memory_history=memory_history,
                                   workers_sample_s=workers_sample_s)
        extra_hooks = list(extra_hooks)
        self.hooks = default_hooks(profiler=profiler, profile_schedule=profile_schedule,
                                   profile_at=profile_at, profile_memory=profile_memory,
                                   profile_record_shapes=profile_record_shapes,
                                   leak_watch=leak_watch, ledger=ledger,
                                   attribution=attribution and not any(
                                       isinstance(h, MemoryAttribution) for h in extra_hooks),
                                   attribute_at=attribute_at, attribute_steps=attribute_steps,
                                   extra=extra_hooks)
        if not any(isinstance(h, HintWatch) for h in self.hooks):
            self.hooks.append(HintWatch())  # the tutorial's pitfalls, each said once
        # CUDA: the host heap is read at the step's end only for an instrument that watches it
        self.memory.host_heap = any(getattr(h, "wants_host_heap", False) for h in self.hooks)
        self.profiler = next((h for h in self.hooks if hasattr(h, "open_window")), None)
        self.attribution = next((h for h in self.hooks if isinstance(h, MemoryAttribution)),
                                None)
        self._wire_attribution()
        self.ctx = session.context(model, optimizer, scaler, self._amp,
                                   warmup_steps=warmup_steps, max_steps=max_steps,
                                   model_shape=model_shape, config=dict(config or {}),
                                   max_memory_bytes=max_memory_bytes)
        self._forward_hook = model.register_forward_hook(ForwardCounter(model, self._on_forward))
        self.phases = PhaseClock(model, optimizer, device, own_forward_hook=False) \
            if step_split else None
        for hook in self.hooks:
            hook.setup(self.ctx)
        self.context_hooks = overriding(self.hooks, "step_context")  # the step path's calls
        end_hooks = overriding(self.hooks, "end_step")
        self._end_hooks = [h for h in end_hooks if not h.batched]  # at the step's end
        self._batched_hooks = [h for h in end_hooks if h.batched]  # with the row, in batches
        self.recorder.on_row = self._row_published
        if self.profiler is not None:
            session.offer("profile", self.profiler.open_window)
            session.offer("profile_cancel", self.profiler.cancel)
        if self.attribution is not None:
            session.offer("attribute", self.attribution.open_attribution)
            session.offer("attribute_cancel", self.attribution.cancel_attribution)
        handlers = dict(requests or {})
        for kind in sorted(handlers):
            session.offer(kind, handlers[kind])
        if listen:
            session.listen()
        if warmup_steps == 0:
            self.memory.reset_peak()  # no warmup: the peak starts with the first step
        if endpoint is not None:
            session.run_started_extra["metrics_url"] = endpoint.url
        session.start(amp=self._amp, params=sum(p.numel() for p in model.parameters()),
                      tokens_per_step=tokens_per_step, samples_per_step=samples_per_step,
                      flops_per_token=flops_per_token, world_size=env_world_size(),
                      rank=self.rank, step_split=self.phases is not None,
                      step_clock=STEP_CLOCK_CUDA if self.phases is not None
                      and self.phases.ring is not None else STEP_CLOCK_HOST)
        if endpoint is not None:  # after run_started: the first scrape has the run's facts
            session.serve_metrics(endpoint, env_world_size())
        self.guard = MemoryGuard(max_memory_bytes, self.device.type, self.emit,
                                 self.control.stop, warmup_steps=warmup_steps)
        # a limit already passed stops before step 1; the read is not a step's: no peak from it
        self.guard.check(0, self.memory.read(count_peak=False))
        _OPEN.add(self)

    # the loop's side ------------------------------------------------------------------------
    def step(self) -> StepScope:
        """A context manager around one optimizer step (forward, backward, update)."""
        if self.closed:
            raise MonitorStateError("this Monitor is closed; create a new Monitor for another "
                                    "run")
        if self._in_step is not None:
            raise MonitorStateError(f"step {self._in_step.step} has not ended: steps do not "
                                    "nest (wrap each optimizer step once)")
        step = self.step_count + 1
        if self._boundary_done < step:
            self._boundary(step)
        return StepScope(self, step)

    def request_attribution(self, source: str = "api") -> None:
        """A memory attribution window from the next step boundary on (one warm-up step, then
        ``attribute_steps`` measured ones): a ``memory_attribution`` event with each module's
        parameters, gradients, optimizer state, saved activations and forward peak. Safe from
        any thread; MonitorStateError when this Monitor has no attribution window."""
        if self.attribution is None:
            raise MonitorStateError("this Monitor was made with attribution=False")
        self.control.request_attribution(source)

    def cancel_attribution(self, source: str = "api") -> None:
        """End an open (or requested) attribution window at the next step boundary."""
        self.control.cancel_attribution(source)

    def _wire_attribution(self) -> None:
        """The attribution window waits while a profiler window traces; the ledger leaves the
        window's steps alone (both use saved-tensor hooks: only the innermost sees tensors)."""
        attr, profiler = self.attribution, self.profiler
        if attr is None:
            return
        if profiler is not None:
            attr.blocked = lambda: bool(profiler.tracing)
        for hook in self.hooks:
            if isinstance(hook, Ledger):
                hook.yield_to = lambda: attr.attributing

    @property
    def step_count(self) -> int:
        """Optimizer steps finished so far."""
        return self.session.step

    @property
    def should_stop(self) -> bool:
        """True once a stop was asked for (a viewer, --max-memory, a full disk): end the loop.

        Checked before a step, it also does that step's boundary work (due requests, waiting
        while paused), so a stop sent during a pause ends the loop without one more step."""
        nxt = self.step_count + 1
        if not self.closed and self._in_step is None and self._boundary_done < nxt \
                and not self.control.stop_requested:
            self._boundary(nxt)
        return self.control.stop_requested

    @property
    def step_in_flight(self) -> int | None:
        """The step whose ``with`` block is running now, if any (read from any thread)."""
        scope = self._in_step
        return scope.step if scope is not None else None

    @property
    def state(self) -> Any:
        """The run's state as its records tell it (probes/runfolder/state.py; RunSession.state
        says how current)."""
        return self.session.state

    @property
    def metrics_url(self) -> str | None:
        """Where Prometheus scrapes this run (``metrics_port``); None when not served here."""
        return self.session.metrics.url if self.session.metrics is not None else None

    @property
    def server(self) -> ControlServer | None:
        """The run's request socket (None with ``listen=False``)."""
        return self.session.server

    @property
    def nvml(self) -> NvmlPoller | None:
        """The driver-level poller (CUDA only)."""
        return self.session.nvml

    def emit(self, name: str, step: int | None = None, data: dict[str, Any] | None = None) \
            -> Event:
        """Write an event row (one of probes.records.EVENT_KINDS, or your own name)."""
        return self.session.emit(name, step, data)

    def between_steps(self, kind: str, data: dict[str, Any] | None = None) -> Event:
        """Something the loop ran between two optimizer steps (``kind``: probes.records.EVALUATE,
        SAVE): its event row, and the instruments do not compare the steps on either side of it,
        so an evaluation's or a checkpoint's memory is not taken for a leak."""
        event = self.emit(kind, self.step_count, data)
        for hook in self.hooks:
            hook.between_steps(kind)
        return event

    def close(self, reason: str | None = None, error: BaseException | None = None) -> None:
        """End the run: instruments closed, run_finished written, threads stopped, report.

        Safe to call twice; never raises for a failure of memtop's own parts.
        """
        if self.closed:
            return
        self.closed = True
        _OPEN.discard(self)
        with contextlib.suppress(Exception):
            self.recorder.drain()  # the last rows' batched hooks run before the hooks close
        if error is not None and self.session.failed_step is None:
            self.session.record_error(self.step_count, error)
        for hook in self.hooks:
            with contextlib.suppress(Exception):
                hook.close()
        with contextlib.suppress(Exception):
            self._forward_hook.remove()
        if self.phases is not None:
            self.phases.close()  # removes hooks only: never raises
        self.session.close(reason)
        if self.write_report_at_close:
            with contextlib.suppress(Exception):
                from probes.analysis.report.build import write_report

                write_report(self.run_dir)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if isinstance(exc, KeyboardInterrupt):
            self.close(reason="interrupted (KeyboardInterrupt)")
        else:
            self.close(error=exc if isinstance(exc, Exception) else None)
        return False

_OPEN: weakref.WeakSet[Monitor] = weakref.WeakSet()  # monitors not closed yet


@atexit.register
def _close_at_exit() -> None:
    """A loop that forgot close(): end its runs properly (run_finished, socket file gone)."""
    for monitor in list(_OPEN):
        if not monitor.closed:
            monitor.close(reason="interpreter exit without close()")
