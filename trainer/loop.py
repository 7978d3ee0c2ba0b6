"""The AMP training loop, run on its own thread, reporting each step through sinks.

Step order follows the tutorial exactly: autocast region -> loss -> scaler.scale(loss).backward()
-> scaler.unscale_(optimizer) -> clip -> scaler.step -> scaler.update. Everything torch does happens
on the training thread (model build included): torch work on the UI thread slows training ~3×.
"""

from __future__ import annotations

import contextlib
import gc
import math
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch.profiler import record_function

from probes.hooks import RunContext, StepHook, StepTensors
from probes.memory import MemoryProbe
from probes.nvml import NvmlPoller
from probes.rundir import MetricsWriter, write_json
from probes.sample import Event, StepSample
from probes.sysinfo import host_ram_bytes, system_info
from trainer.config import TrainConfig
from trainer.control import TrainControl
from trainer.data import BatchSampler, load_corpus
from trainer.leaks import LEAK_HINTS, LeakInjector
from trainer.model import GPT

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

Record = StepSample | Event
Sink = Callable[[Record], None]


class NonFiniteError(RuntimeError):
    """Loss or gradients became inf/nan with no GradScaler to skip the step."""


@dataclass(frozen=True)
class TrainerStatus:
    """A snapshot the UI may read at any time; the trainer replaces it, never mutates it."""

    state: str = "starting"  # starting | running | paused | profiling | stopped | failed
    step: int = 0
    device_name: str = ""
    device_total_bytes: int | None = None
    params: int = 0
    profile_phase: str | None = None  # "wait 1/1", "active 2/3", "analysing" ...
    leak_active: bool = False
    stop_reason: str | None = None
    error: str | None = None


class Trainer:
    """Builds the model on its own thread and trains it until ``steps`` or a stop request."""

    def __init__(self, config: TrainConfig, run_dir: Path, control: TrainControl | None = None,
                 sinks: list[Sink] | None = None, hooks: list[StepHook] | None = None,
                 freeze_gc: bool = True) -> None:
        self.config = config
        self.run_dir = run_dir
        self.control = control or TrainControl()
        self.sinks = list(sinks or [])
        self.hooks = list(hooks or [])
        self.freeze_gc = freeze_gc  # gc.freeze() once set-up is done (see run())
        self.status = TrainerStatus()
        self.exit_code: int | None = None  # 0 finished/stopped, 1 failed
        self.write_failed = False  # metrics.jsonl could not be written (disk full ...)
        self._thread: threading.Thread | None = None
        self._writer: MetricsWriter | None = None
        self._t0 = time.perf_counter()
        self.leak = LeakInjector(config.leak)
        self._open_hooks: list[StepHook] = []  # closed once, before run_finished
        self.sink_errors: list[str] = []  # sinks dropped because they raised

    # thread management -------------------------------------------------------------------------
    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self.run, name="memtop-trainer", daemon=True)
        self._thread.start()
        return self._thread

    def join(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # records -------------------------------------------------------------------------------------
    def elapsed_s(self) -> float:
        return time.perf_counter() - self._t0

    def emit(self, event: Event) -> None:
        self._publish(event)

    def _publish(self, record: Record) -> None:
        if self._writer is not None:
            try:
                if isinstance(record, StepSample):
                    self._writer.write_sample(record)
                else:
                    self._writer.write_event(record)
            except OSError as exc:  # disk full, file system gone: stop cleanly, keep the UI up
                self._writer_failed(exc, record)
        self._to_sinks(record)

    def _to_sinks(self, record: Record) -> None:
        """A sink that fails (a closed pipe, a UI bug) is dropped; it never stops the training."""
        for sink in list(self.sinks):
            try:
                sink(record)
            except Exception as exc:
                self.sinks.remove(sink)
                self.sink_errors.append(f"{type(exc).__name__}: {exc}")

    def _writer_failed(self, exc: OSError, record: Record) -> None:
        writer, self._writer = self._writer, None  # stop writing; every earlier row is complete
        if writer is not None:
            writer.close()
        self.write_failed = True
        path = writer.path if writer is not None else "metrics.jsonl"
        reason = (f"cannot write {path}: {exc.strerror or exc}; training stopped, "
                  f"rows up to step {max(0, record.step - 1)} are saved")
        self.control.stop(reason)
        self._set_status(stop_reason=reason)
        self._to_sinks(Event("metrics_write_failed", record.step, self.elapsed_s(),
                             {"reason": reason}))

    def _set_profile_phase(self, phase: str | None) -> None:
        self._set_status(profile_phase=phase)

    def _set_status(self, **changes: object) -> None:
        self.status = replace(self.status, **changes)

    # the run -------------------------------------------------------------------------------------
    def run(self) -> int:
        """Train; returns 0 when finished or stopped, 1 when the training failed."""
        cfg = self.config
        self._t0 = time.perf_counter()
        nvml: NvmlPoller | None = None
        memory: MemoryProbe | None = None
        finish: dict[str, str] = {"reason": "failed"}
        self._open_hooks = list(self.hooks)
        try:
            write_json(self.run_dir / "config.json", cfg.to_json())
            self._writer = MetricsWriter(self.run_dir / "metrics.jsonl")
            torch.manual_seed(cfg.seed)
            device = cfg.torch_device
            amp = cfg.amp_mode
            memory = MemoryProbe(device)
            if device.type == "cuda":
                _record_allocator_history(device)
            model = GPT(cfg.model_config()).to(device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.1)
            scaler = torch.amp.GradScaler(device.type) if amp == "fp16" else None
            batches = BatchSampler(load_corpus(), cfg.batch_size, cfg.seq_len, cfg.seed, device)
            if device.type == "cuda":
                nvml = NvmlPoller.for_cuda_device(device)
                nvml.start()
                name = torch.cuda.get_device_name(device)
                total = torch.cuda.get_device_properties(device).total_memory
            else:
                name, total = "CPU", host_ram_bytes()
            self._set_status(state="running", device_name=name, device_total_bytes=total,
                             params=model.num_params())
            ctx = RunContext(cfg, model, optimizer, scaler, device, amp, self.run_dir, memory,
                             self.emit, self.elapsed_s, self._set_profile_phase, total)
            for hook in self.hooks:
                hook.setup(ctx)
            if self.freeze_gc:
                # torch, the model and the UI are ~200k long-lived objects; a gen-2 collection
                # walking them holds the GIL ~100 ms. Frozen, they are never walked again.
                gc.collect()
                gc.freeze()
            self.emit(Event("run_started", 0, self.elapsed_s(), {
                "device": str(device), "device_name": name, "device_total_bytes": total,
                "amp": amp, "params": model.num_params(),
                "counters": memory.counter_source,
                "driver_counter": _driver_counter_label(device, nvml),
                "nvml_error": nvml.error if nvml else None,
                "system": system_info(device),  # hardware/software for the report
            }))
            self._train(model, optimizer, scaler, batches, memory, nvml, device, amp)
            self._close_hooks()  # a profiler window cut short reports before run_finished
            reason = self.control.stop_reason or "finished"
            finish = {"reason": reason}
            self._set_status(state="stopped", stop_reason=reason)
            self.exit_code = 1 if self.write_failed else 0
        except Exception as exc:  # a monitoring tool stays up when the training fails
            message = f"{type(exc).__name__}: {exc}"
            data = {"error_type": type(exc).__name__, "message": str(exc),
                    "traceback": traceback.format_exc()}
            data.update(_failure_artifacts(self.run_dir, exc, self.config.torch_device))
            self._set_status(state="failed", error=message, stop_reason=message)
            self.emit(Event("error", self.status.step, self.elapsed_s(), data))
            self.exit_code = 1
        finally:
            self._close_hooks()
            with contextlib.suppress(Exception):
                self.emit(Event("run_finished", self.status.step, self.elapsed_s(), finish))
            if nvml is not None:
                nvml.stop()
            if memory is not None:
                memory.close()
            self.leak.stop()
            if self._writer is not None:
                self._writer.close()
            if self.exit_code is None:  # an exception this loop did not expect
                self.exit_code = 1
        return self.exit_code

    def _close_hooks(self) -> None:
        hooks, self._open_hooks = self._open_hooks, []
        for hook in hooks:
            with contextlib.suppress(Exception):
                hook.close()

    def _train(self, model: GPT, optimizer: torch.optim.Optimizer,
               scaler: torch.amp.GradScaler | None, batches: BatchSampler, memory: MemoryProbe,
               nvml: NvmlPoller | None, device: torch.device, amp: str) -> int:
        cfg = self.config
        autocast_dtype = AMP_DTYPES.get(amp)
        tokens = cfg.batch_size * cfg.seq_len
        skipped = 0
        scale = scaler.get_scale() if scaler is not None else None
        step = 0
        prev_watched: int | None = None
        model.train()
        if cfg.warmup_steps == 0:
            memory.reset_peak()  # no warmup: the peak starts with the first step
        while cfg.steps == 0 or step < cfg.steps:
            if self.control.paused:
                self._set_status(state="paused")
            if not self.control.wait_while_paused():
                break
            step += 1
            self._handle_requests(step)
            self._set_status(state="running", step=step - 1)

            t_start = time.perf_counter()
            with contextlib.ExitStack() as stack:
                for hook in self.hooks:
                    stack.enter_context(hook.step_context(step))
                x, y = batches.next_batch()
                with record_function("forward"), torch.autocast(
                    device_type=device.type, dtype=autocast_dtype or torch.float32,
                    enabled=autocast_dtype is not None,
                ):
                    logits, loss = model(x, y)
                memory.observe_peak()  # activations are at their height here
                with record_function("backward"):
                    if scaler is not None:
                        scaler.scale(loss).backward()
                    else:
                        loss.backward()
                with record_function("optimizer"):
                    if scaler is not None:
                        scaler.unscale_(optimizer)  # clipping must see true gradients
                    grad_norm = torch.nn.utils.clip_grad_norm_(
                        model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
                    if scaler is not None:
                        scaler.step(optimizer)  # skipped inside when gradients hold inf/nan
                        scaler.update()
                    else:
                        optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                loss_value = loss.item()  # the blocking sync a loop that logs loss does anyway
            step_s = time.perf_counter() - t_start
            norm_value = float(grad_norm)
            if scaler is not None:
                new_scale = scaler.get_scale()
                if new_scale < scale:  # the scaler backs off exactly when it skipped the step
                    skipped += 1
                scale = new_scale
            elif not (math.isfinite(loss_value) and math.isfinite(norm_value)):
                what = "loss" if not math.isfinite(loss_value) else "gradient norm"
                raise NonFiniteError(
                    f"{what} became {loss_value if what == 'loss' else norm_value} at step {step} "
                    f"with amp={amp} and no GradScaler to skip it; the weights are no longer valid")

            if step == cfg.warmup_steps:
                memory.reset_peak()  # model set-up and first-step allocations leave the peak
            reading = memory.read()
            driver = reading.host_rss_bytes
            if device.type == "cuda":
                latest = nvml.latest if nvml is not None else None
                driver = latest.driver_bytes if latest is not None else None
            sample = StepSample(
                step=step, time_s=self.elapsed_s(), loss=loss_value,
                tokens_per_s=tokens / step_s if step_s > 0 else 0.0, step_ms=step_s * 1000.0,
                allocated_bytes=reading.allocated_bytes, reserved_bytes=reading.reserved_bytes,
                peak_allocated_bytes=reading.peak_allocated_bytes, driver_used_bytes=driver,
                host_rss_bytes=reading.host_rss_bytes, scale=scale, skipped_steps=skipped,
                amp=amp, device=str(device), grad_norm=norm_value,
                profiling=self.status.profile_phase is not None,
                leak_active=self.leak.active,
            )
            self._publish(sample)
            tensors = StepTensors(loss=loss, logits=logits)
            self.leak.keep(loss, logits)
            for hook in self.hooks:
                hook.end_step(step, tensors, sample)
            del tensors, loss, logits, x, y
            self._set_status(step=step)
            prev_watched = self._check_memory_guard(step, reading, prev_watched, device)
            if self.control.stop_requested:
                break
        return step

    def _handle_requests(self, step: int) -> None:
        profile, leak = self.control.take_requests()
        for _ in range(leak):
            self.toggle_leak(step)
        cfg = self.config
        if cfg.leak_at is not None and step == cfg.leak_at and not self.leak.active:
            self.toggle_leak(step)
        if cfg.leak_stop_at is not None and step == cfg.leak_stop_at and self.leak.active:
            self.toggle_leak(step)
        if profile:
            for hook in self.hooks:
                request = getattr(hook, "request", None)
                if request is not None:
                    for _ in range(profile):
                        request(step)

    def toggle_leak(self, step: int) -> None:
        """Start the configured leak demo, or stop it and drop what it kept (training thread)."""
        if self.leak.active:
            dropped = self.leak.stop()
            self.emit(Event("leak_demo_stopped", step, self.elapsed_s(),
                            {"kind": self.leak.kind, "released_tensors": dropped}))
        else:
            self.leak.start(step)
            self.emit(Event("leak_demo_started", step, self.elapsed_s(),
                            {"kind": self.leak.kind, "hint": LEAK_HINTS[self.leak.kind]}))
        self._set_status(leak_active=self.leak.active)

    def _check_memory_guard(self, step: int, reading, prev: int | None,
                            device: torch.device) -> int | None:
        """Stop before the watched counter passes --max-memory at the current growth rate."""
        limit = self.config.max_memory_bytes
        watched = reading.allocated_bytes if device.type == "cuda" else reading.host_rss_bytes
        if limit is None or watched is None:
            return watched
        growth = max(0, watched - prev) if prev is not None else 0
        if watched + growth > limit:
            counter = "device allocated" if device.type == "cuda" else "host RSS"
            reason = (f"memory guard: {counter} at {watched} bytes would pass --max-memory "
                      f"{limit} bytes next step")
            self.emit(Event("memory_guard", step, self.elapsed_s(), {
                "counter": counter, "watched_bytes": watched, "limit_bytes": limit,
                "growth_bytes_per_step": growth}))
            self.control.stop(reason)
        return watched


def _driver_counter_label(device: torch.device, nvml: NvmlPoller | None) -> str:
    if device.type != "cuda":
        return "process RSS (/proc/self/statm)"
    if nvml is None or not nvml.available:
        return "n/a (NVML unavailable)"
    return "NVML memory of this process (all processes' when the pid is not visible)"


def _record_allocator_history(device: torch.device) -> None:
    """Keep a bounded allocation history so a failure's snapshot opens in memory_viz with stacks."""
    with contextlib.suppress(Exception):
        torch.cuda.memory._record_memory_history(max_entries=100_000, device=device)


def _failure_artifacts(run_dir: Path, exc: BaseException, device: torch.device) -> dict:
    """On CUDA, keep what explains a failure: memory_summary text and an allocator snapshot."""
    out: dict[str, str] = {}
    if device.type != "cuda" or not torch.cuda.is_available():
        return out
    try:
        summary = run_dir / "cuda_memory_summary.txt"
        summary.write_text(torch.cuda.memory_summary(device), encoding="utf-8")
        out["memory_summary"] = summary.name
    except Exception as err:  # keep going: the error row matters more
        out["memory_summary_error"] = str(err)
    try:
        snapshot = run_dir / "cuda_memory_snapshot.pickle"
        torch.cuda.memory._dump_snapshot(str(snapshot))
        out["memory_snapshot"] = snapshot.name
    except Exception as err:
        out["memory_snapshot_error"] = str(err)
    return out
