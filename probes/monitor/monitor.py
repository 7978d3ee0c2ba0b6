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
on the caller's thread except the NVML poller and the socket listener, which never touch the
step path; both stop on close() and at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import time
import traceback
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from probes import records as R
from probes.control.requests import Request, RunControl
from probes.control.unix_socket import ControlServer
from probes.counters.cudamem import dump_snapshot, failure_artifacts, start_history, stop_history
from probes.counters.host import host_ram_bytes
from probes.counters.memory import MemoryProbe, guard_trip
from probes.counters.nvml import NvmlPoller
from probes.counters.sysinfo import system_info
from probes.instruments.hints import HintWatch
from probes.instruments.hooks import GPTShape, RunContext, StepHook, StepTensors
from probes.monitor.setup import (
    autocast_mode,
    check_args,
    default_hooks,
    driver_label,
    env_rank,
    env_world_size,
    initial_scale,
    make_folder,
)
from probes.monitor.stepvalues import StepValues, read_step_values
from probes.records import Event, StepSample
from probes.records.errors import MonitorArgumentError, MonitorStateError, NonFiniteError
from probes.runfolder import socket_name
from probes.runfolder.recorder import RunRecorder, Sink

__all__ = ["Monitor", "StepScope", "default_hooks"]


class StepScope:
    """One optimizer step, from ``with mon.step() as step:`` to its end."""

    def __init__(self, monitor: Monitor, step: int) -> None:
        self.monitor = monitor
        self.step = step  # 1-based number of this optimizer step
        self.sample: StepSample | None = None  # set when the step has ended
        self._values = StepValues()
        self._stack = contextlib.ExitStack()
        self._t0 = 0.0

    def set(self, *, loss: Any = None, grad_norm: Any = None, output: torch.Tensor | None = None,
            tokens: int | None = None, samples: int | None = None) -> None:
        """Hand over what this step computed. Tensors are read once, after the step, in one
        transfer (no extra device sync); ``output`` (e.g. logits) only sizes leak hints."""
        v = self._values
        v.loss = loss if loss is not None else v.loss
        v.grad_norm = grad_norm if grad_norm is not None else v.grad_norm
        v.output = output if output is not None else v.output
        v.tokens = tokens if tokens is not None else v.tokens
        v.samples = samples if samples is not None else v.samples

    def __enter__(self) -> StepScope:
        self._t0 = time.perf_counter()
        try:
            for hook in self.monitor.hooks:
                self._stack.enter_context(hook.step_context(self.step))
        except BaseException:
            self._stack.close()
            raise
        self.monitor._step_began(self)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        mon = self.monitor
        try:
            self._stack.__exit__(exc_type, exc, tb)
        finally:
            mon._in_step = None
        if exc is not None:
            mon._step_failed(self.step, exc)
            return False
        try:
            mon._step_ended(self, time.perf_counter())
        except NonFiniteError as err:
            mon._step_failed(self.step, err)
            raise
        return False


class Monitor:
    """Instruments one process's training loop; see the module docstring for the loop.

    Only ``model`` and ``optimizer`` are needed. Keywords: ``scaler`` (GradScaler: scale and
    skipped steps); ``tokens_per_step`` or ``samples_per_step`` (throughput; steps/s otherwise);
    ``run_dir`` (a fresh ``<time>-<id>/`` folder is made under it) or ``run_folder`` (this exact,
    existing folder); ``config`` (written to config.json); ``amp`` ("off", "bf16", "fp16"; seen
    in the forward pass when not given); ``warmup_steps`` (peaks reset after them, instruments
    ignore them); ``max_steps``; ``profile_at`` steps and the window's ``profile_schedule``
    (wait, warmup, active); ``leak_watch``, ``ledger``, ``profiler``, ``listen`` (the request
    socket) to switch parts off; ``max_memory_bytes`` (stop before that); ``flops_per_token``
    (MFU in the report; unknown otherwise); ``write_report`` at close; ``requests`` (request
    kinds this class cannot do itself, with handlers; announced in run_started); ``non_finite``
    ("record": a step whose loss or gradient norm is inf/nan is written as measured; "fail":
    without a GradScaler such a step raises NonFiniteError from its ``with`` block and is
    recorded as the run's error, not as a sample); ``memory_history`` (CUDA: record
    allocations with Python stacks for the OOM snapshot; costs µs per allocation, off by
    default, probes/counters/cudamem.py).
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
                 listen: bool = True, max_memory_bytes: int | None = None,
                 flops_per_token: float | None = None, model_shape: GPTShape | None = None,
                 write_report: bool = True, sinks: Iterable[Sink] = (),
                 control: RunControl | None = None, recorder: RunRecorder | None = None,
                 extra_hooks: Iterable[StepHook] = (), rank: int | None = None,
                 requests: Mapping[str, Callable[[int], None]] | None = None,
                 non_finite: str = "record", memory_history: bool = False) -> None:
        device = check_args(model, optimizer, scaler, tokens_per_step, samples_per_step, amp,
                             warmup_steps, max_steps)
        if non_finite not in ("record", "fail"):
            raise MonitorArgumentError(f"non_finite must be 'record' or 'fail', got "
                                       f"{non_finite!r}")
        self.non_finite = non_finite
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.device = device
        self.tokens_per_step, self.samples_per_step = tokens_per_step, samples_per_step
        self.memory_history = "off"
        self.warmup_steps, self.max_steps = warmup_steps, max_steps
        self.max_memory_bytes = max_memory_bytes
        self.write_report_at_close = write_report
        self.control = control or RunControl()
        self.rank = rank if rank is not None else env_rank()
        self.step_count = 0
        self.closed = False
        self._in_step: StepScope | None = None
        self._failed_step: int | None = None
        self._amp = amp or "auto"
        self._request_handlers: dict[str, Callable[[int], None]] = dict(requests or {})
        self._boundary_done = 0  # the step whose boundary work is done
        self._prev_watched: dict[str, int | None] | None = None
        self._skipped = 0
        self._scale = initial_scale(scaler)
        self._micro = 0
        self.leak_active = False  # set by a loop that runs memtop's leak demo
        if recorder is None:
            folder = make_folder(run_dir, run_folder)
            cfg = dict(config or {})
            cfg.setdefault("monitor", {"warmup_steps": warmup_steps, "max_steps": max_steps,
                                       "tokens_per_step": tokens_per_step,
                                       "samples_per_step": samples_per_step,
                                       "model": type(model).__name__})
            recorder = RunRecorder(folder, rank=self.rank, sinks=sinks, config=cfg)
        else:
            recorder.sinks.extend(sinks)
        recorder.on_write_failed = lambda reason: self.control.stop(reason)
        self.recorder = recorder
        self.run_dir = recorder.run_dir
        self.memory = MemoryProbe(device)
        self.nvml: NvmlPoller | None = None
        if device.type == "cuda":
            self.nvml = NvmlPoller.for_cuda_device(device)
            self.nvml.start()
            total: int | None = torch.cuda.get_device_properties(device).total_memory
            name = torch.cuda.get_device_name(device)
        else:
            total, name = host_ram_bytes(), "CPU"
        self.hooks = default_hooks(profiler=profiler, profile_schedule=profile_schedule,
                                   profile_at=profile_at, profile_memory=profile_memory,
                                   profile_record_shapes=profile_record_shapes,
                                   leak_watch=leak_watch, ledger=ledger, extra=extra_hooks)
        if not any(isinstance(h, HintWatch) for h in self.hooks):
            self.hooks.append(HintWatch())  # the tutorial's pitfalls, each said once
        self.profiler = next((h for h in self.hooks if hasattr(h, "open_window")), None)
        self.ctx = RunContext(model, optimizer, scaler, device, self._amp, self.run_dir,
                              self.memory, recorder.publish, recorder.elapsed_s, total,
                              warmup_steps=warmup_steps, max_steps=max_steps,
                              model_shape=model_shape, config=dict(config or {}), rank=self.rank,
                              urgent=lambda: self.control.urgent)
        self._forward_hook = model.register_forward_hook(self._on_forward)
        for hook in self.hooks:
            hook.setup(self.ctx)
        self.server: ControlServer | None = None
        if listen:
            self.server = ControlServer(self.run_dir / socket_name(self.rank), self.control,
                                        self._status, self._refuse)
            self.server.start()
        if warmup_steps == 0:
            self.memory.reset_peak()  # no warmup: the peak starts with the first step
        self.memory_history = start_history(device, memory_history)
        self.emit(R.RUN_STARTED, 0, {
            "device": str(device), "device_name": name, "device_total_bytes": total,
            "amp": self._amp, "params": sum(p.numel() for p in model.parameters()),
            "counters": self.memory.counter_source,
            "driver_counter": driver_label(device, self.nvml),
            "memory_history": self.memory_history,
            "nvml_error": self.nvml.error if self.nvml else None,
            "nvml_match": self.nvml.match if self.nvml else None,
            "mig": self.nvml.is_mig if self.nvml and self.nvml.available else None,
            "tokens_per_step": tokens_per_step, "samples_per_step": samples_per_step,
            "flops_per_token": flops_per_token, "pid": os.getpid(),
            "world_size": env_world_size(), "rank": self.rank,
            "socket": self.server.path.name if self.server and not self.server.error else None,
            "socket_error": self.server.error if self.server else "not listening",
            "requests": self._capabilities(), "system": system_info(device)})
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
        """The run's state as its records tell it (probes/runfolder/state.py)."""
        return self.recorder.state

    def emit(self, name: str, step: int | None = None, data: dict[str, Any] | None = None) \
            -> Event:
        """Write an event row (one of probes.records.EVENT_KINDS, or your own name)."""
        return self.recorder.emit(name, self.step_count if step is None else step, data)

    def on_request(self, kind: str, handler: Callable[[int], None]) -> None:
        """Act on a request kind this class cannot do itself (memtop's leak demo), at the step
        boundary, with the number of the step about to run."""
        self._request_handlers[kind] = handler

    def close(self, reason: str | None = None, error: BaseException | None = None) -> None:
        """End the run: instruments closed, run_finished written, threads stopped, report.

        Safe to call twice; never raises for a failure of memtop's own parts.
        """
        if self.closed:
            return
        self.closed = True
        _OPEN.discard(self)
        if error is not None and self._failed_step is None:
            self._record_error(self.step_count, error)
        for hook in self.hooks:
            with contextlib.suppress(Exception):
                hook.close()
        failed = self._failed_step is not None
        why = "failed" if failed else (reason or self.control.stop_reason or "finished")
        with contextlib.suppress(Exception):
            self.emit(R.RUN_FINISHED, self.step_count, {"reason": why})
        with contextlib.suppress(Exception):
            self._forward_hook.remove()
        if self.server is not None:
            self.server.close()
        if self.nvml is not None:
            self.nvml.stop()
        stop_history(self.memory_history)
        self.memory.close()
        self.recorder.close()
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

    # inside a step ------------------------------------------------------------------------------
    def _on_forward(self, module: Any, inputs: Any, output: Any) -> None:
        """The model's forward ended: count the micro-batch, fold the activation peak into
        the sampled CPU peak, and see which autocast dtype the loop uses."""
        if self._in_step is None:
            return  # an evaluation pass between steps
        self._micro += 1
        self.memory.observe_peak()
        if self._amp == "auto":
            self._amp = autocast_mode(self.device) or "off"
            self.ctx.amp = self._amp

    def _step_began(self, scope: StepScope) -> None:
        self._in_step = scope
        self._micro = 0
        self.memory.begin_step()  # this step's peak starts here (CUDA: no sync)
        self._tracing = self.profiler is not None and self.profiler.tracing

    def _step_ended(self, scope: StepScope, t_end: float) -> None:
        step, v = scope.step, scope._values
        scale_t = self._scale_tensor()
        synced = any(isinstance(x, torch.Tensor) and x.device.type != "cpu"
                     for x in (v.loss, v.grad_norm, scale_t))
        loss, grad_norm, scale = read_step_values(v.loss, v.grad_norm, scale_t)
        step_s = max(time.perf_counter() - scope._t0, 1e-9)
        if self.non_finite == "fail" and (self.scaler is None or not self.scaler.is_enabled()):
            bad = next(((what, val) for what, val in (("loss", loss), ("gradient norm", grad_norm))
                        if val is not None and not math.isfinite(val)), None)
            if bad is not None:
                raise NonFiniteError(
                    f"{bad[0]} became {bad[1]} at step {step} with amp={self._amp} and no "
                    "GradScaler to skip it; the weights are no longer valid")
        if scale is not None:
            if self._scale is not None and scale < self._scale:
                self._skipped += 1  # the scaler backs off exactly when it skipped the step
            self._scale = scale
        reading = self.memory.read()
        if step == self.warmup_steps:
            self.memory.reset_peak()  # set-up and first-step allocations leave the run's peak
        driver = reading.host_rss_bytes
        if self.device.type == "cuda":
            latest = self.nvml.latest if self.nvml is not None else None
            driver = latest.driver_bytes if latest is not None else None
        tokens = v.tokens if v.tokens is not None else self.tokens_per_step
        samples = v.samples if v.samples is not None else self.samples_per_step
        sample = StepSample(
            step=step, time_s=self.recorder.elapsed_s(), loss=loss,
            tokens_per_s=tokens / step_s if tokens else None, step_ms=step_s * 1000.0,
            allocated_bytes=reading.allocated_bytes, reserved_bytes=reading.reserved_bytes,
            peak_allocated_bytes=reading.peak_allocated_bytes, driver_used_bytes=driver,
            host_rss_bytes=reading.host_rss_bytes, scale=scale if self.scaler else None,
            skipped_steps=self._skipped, amp=self._amp, device=str(self.device),
            grad_norm=grad_norm, profiling=self._tracing,
            leak_active=self.leak_active,
            samples_per_s=samples / step_s if samples else None,
            micro_batches=self._micro or None, rank=self.rank or 0,
            step_peak_allocated_bytes=reading.step_peak_allocated_bytes,
            alloc_retries=reading.alloc_retries, ooms=reading.ooms)
        scope.sample = sample
        self.recorder.publish(sample)
        tensors = StepTensors(loss=v.loss if isinstance(v.loss, torch.Tensor) else None,
                              output=v.output, synced=synced)
        for hook in self.hooks:
            hook.end_step(step, tensors, sample)
        self.step_count = step
        self._guard(step, reading)
        if not self.should_stop and (self.max_steps == 0 or step < self.max_steps):
            self._boundary(step + 1)  # requests and pauses, before the loop's next step

    def _step_failed(self, step: int, exc: BaseException) -> None:
        if isinstance(exc, KeyboardInterrupt):
            return  # an interruption, not a failure: close() says so
        self._record_error(step, exc)

    def _record_error(self, step: int, exc: BaseException) -> None:
        self._failed_step = step
        data: dict[str, Any] = {
            "error_type": type(exc).__name__, "message": str(exc),
            "traceback": "".join(traceback.format_exception(type(exc), exc,
                                                            exc.__traceback__))}
        data.update(failure_artifacts(self.run_dir, self.device, self.memory_history))
        with contextlib.suppress(Exception):
            self.emit(R.ERROR, step, data)

    def _scale_tensor(self) -> Any:
        """The GradScaler's scale as it stands, without a sync (read with the loss)."""
        scaler = self.scaler
        if scaler is None or not scaler.is_enabled():
            return None
        getter = getattr(scaler, "_get_scale_async", None)
        tensor = getter() if getter is not None else None
        return tensor if tensor is not None else scaler.get_scale()

    # step boundaries: requests, pauses, the memory guard ------------------------------------
    def _boundary(self, step: int) -> None:
        """Before ``step`` runs: act on due requests, then wait while paused."""
        self._boundary_done = step
        for req in self.control.take_due(step):
            self._act(req, step)
        if self.control.paused and not self.control.stop_requested:
            self.emit(R.PAUSED, step - 1, {})
            t0 = time.perf_counter()
            self.control.wait_while_paused()
            self.emit(R.RESUMED, step - 1, {"paused_s": time.perf_counter() - t0})
            for req in self.control.take_due(step):  # what came in while paused
                self._act(req, step)

    def _act(self, req: Request, step: int) -> None:
        self.emit(R.CONTROL, step - 1, {"request": req.kind, "source": req.source,
                                        "at_step": req.at_step})
        prof = self.profiler
        if req.kind == "profile" and prof is not None:
            prof.open_window(step)
        elif req.kind == "profile_cancel" and prof is not None:
            prof.cancel(step)
        elif req.kind == "pause":
            self.control.pause()
        elif req.kind == "resume":
            self.control.resume()
        elif req.kind == "stop":
            self.control.stop(req.reason or f"stopped by {req.source}")
        elif req.kind == "report":
            self._write_report_async(step)
        elif req.kind == "memory_snapshot":
            self.emit(R.MEMORY_SNAPSHOT, step - 1,
                      dump_snapshot(self.run_dir, self.device, step - 1, self.memory_history))
        elif req.kind in self._request_handlers:
            self._request_handlers[req.kind](step)

    def _write_report_async(self, step: int) -> None:
        """report.md/json off the step path (it reads the whole metrics file)."""
        import threading

        def write() -> None:
            from probes.analysis.report.build import write_report

            try:
                path = write_report(self.run_dir)
            except Exception:
                return
            with contextlib.suppress(Exception):
                self.emit(R.REPORT_WRITTEN, step - 1, {"path": path.name})

        threading.Thread(target=write, name="memtop-report", daemon=True).start()

    def _guard(self, step: int, reading: Any) -> None:
        """Stop before a watched counter passes max_memory_bytes at its current growth: on
        CUDA this step's peak (an OOM happens mid-step) and reserved (the cache must grow to
        allocate); host RSS on CPU."""
        if self.device.type == "cuda":
            watched = {"device step peak": reading.step_peak_allocated_bytes,
                       "device reserved": reading.reserved_bytes}
        else:
            watched = {"host RSS": reading.host_rss_bytes}
        prev, self._prev_watched = self._prev_watched, watched
        trip = guard_trip(watched, prev, self.max_memory_bytes)
        if trip is None:
            return
        counter, value, growth = trip
        limit = self.max_memory_bytes
        self.emit(R.MEMORY_GUARD, step, {"counter": counter, "watched_bytes": value,
                                         "limit_bytes": limit, "growth_bytes_per_step": growth})
        self.control.stop(f"memory guard: {counter} at {value} bytes would pass "
                          f"--max-memory {limit} bytes next step")

    # the socket's side ------------------------------------------------------------------------
    def _capabilities(self) -> list[str]:
        caps = ["pause", "resume", "stop", "report"]
        if self.device.type == "cuda":
            caps.append("memory_snapshot")
        if self.profiler is not None:
            caps += ["profile", "profile_cancel"]
        return caps + sorted(self._request_handlers)

    def _refuse(self, req: Request) -> str | None:
        if req.kind not in self._capabilities():
            return f"this run cannot do {req.kind!r} (it can: {', '.join(self._capabilities())})"
        return None

    def _status(self) -> dict[str, Any]:
        st = self.recorder.state
        return {"pid": os.getpid(), "rank": self.rank, "step": self.step_count,
                "state": st.state, "paused": self.control.paused,
                "requests": self._capabilities()}


_OPEN: weakref.WeakSet[Monitor] = weakref.WeakSet()  # monitors not closed yet


@atexit.register
def _close_at_exit() -> None:
    """A loop that forgot close(): end its runs properly (run_finished, socket file gone)."""
    for monitor in list(_OPEN):
        if not monitor.closed:
            monitor.close(reason="interpreter exit without close()")
