"""A bounded torch.profiler window, opened by a key press or at fixed steps, that closes itself.

A profiler is a diagnosis tool with a cost (docs/ARCHITECTURE.md, the method), so trace a few steps
after a warmup, never the whole run. torch's profiler is thread-local, so every call to it happens
here, on the training thread. When the window ends, the training thread only exports the trace (tens
of ms); the top-ops table is computed by a child process from that trace (probes.traces.opstable),
because key_averages() would hold the GIL ~0.6-0.8 s and freeze the dashboard. The child is started
idle when the window opens (a process start disturbs the next step on two cores) and told to go once
trace.json is written. Its result is picked up at a later step boundary and emitted from the
training thread, like every other event. Measured: benchmarks/cases/profiler/profiler_window.py.
What the window writes (the trace, window.json, the in-process table) and the stderr redirection
around torch's profiler: probes/instruments/proftrace.py.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from probes import records as R
from probes.counters.memory import trim_heap
from probes.instruments.hooks import StepHook, StepTensors
from probes.instruments.proftrace import (
    TRACE_NAME,
    analyse_in_process,
    export_trace,
    stderr_to,
)
from probes.records import Event, StepSample
from probes.runfolder import profile_dir
from probes.traces.worker import spawn_worker

GIL_BREATH_S = 0.02  # between the profiler's stop and the export: the UI thread's turn


@dataclass
class _Window:
    first_step: int
    trigger: str  # "key" | "profile_at"
    prof: Any  # torch.profiler.profile
    index: int = 0  # window steps finished so far
    worker: subprocess.Popen[bytes] | None = None  # started idle at open, told "go" at the end
    steps: dict[str, list[int]] = field(
        default_factory=lambda: {"wait": [], "warmup": [], "active": []})
    rank: int | None = None  # under several ranks each writes its own folder

    @property
    def dir_name(self) -> str:
        """profiles/step-N[/rank-K], relative to the run folder (probes/runfolder/)."""
        return profile_dir(Path(), self.first_step, self.rank).as_posix()


@dataclass
class _Analysis:
    window: _Window
    out_dir: Path
    proc: subprocess.Popen[bytes] | None
    export_s: float
    started: float
    result: dict[str, Any] | None = None  # set at once when analysed in process


class ProfilerWindow(StepHook):
    """``open_window(step)`` opens a window of wait + warmup + active steps (``at_steps`` open
    one by themselves), ``cancel(step)`` ends the open window or its analysis.

    ``analysis``: "subprocess" (default; the UI thread is not stalled) or "inprocess" (torch's
    key_averages() on the training thread: the fallback when no child process can start, and the
    "before" of the profiler_window benchmark). ``keep_profiler`` keeps the last torch profiler
    object as ``last_profiler`` so tests can compare against its own key_averages().

    ``record_shapes`` is off by default: the stop at the window's end runs in torch's C++ with
    the GIL held, and input shapes make it ~2x longer (default model here: ~75 ms without,
    ~130-200 ms with, under load; benchmarks/RESULTS.md), past the dashboard's 100 ms budget.
    window.json still records B, T and the model's sizes.
    """

    def __init__(self, wait: int = 1, warmup: int = 1, active: int = 3, *,
                 at_steps: list[int] | tuple[int, ...] = (), record_shapes: bool = False,
                 profile_memory: bool = False, top_n: int = 20, analysis: str = "subprocess",
                 keep_profiler: bool = False, quiet: bool = True,
                 analysis_timeout_s: float = 120.0, trim_heap: bool = True) -> None:
        if wait < 0 or warmup < 0 or active <= 0:
            raise ValueError("profiler window needs wait >= 0, warmup >= 0 and active > 0")
        if analysis not in ("subprocess", "inprocess"):
            raise ValueError(f"unknown analysis {analysis!r}")
        self.wait, self.warmup, self.active = wait, warmup, active
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.top_n = top_n
        self.analysis = analysis
        self.keep_profiler = keep_profiler
        self.quiet = quiet
        self.analysis_timeout_s = analysis_timeout_s
        self.trim_heap = trim_heap  # after a window: glibc's freed pages back to the OS
        self.trimmed: list[bool | None] = []  # trim_heap()'s answer after each window
        self._pending_at = sorted(set(at_steps))
        self._window: _Window | None = None
        self._analysis: _Analysis | None = None
        self._log_fd: int | None = None
        self._retired: list[subprocess.Popen[bytes]] = []  # workers told to exit, to reap
        self.last_profiler: Any = None
        self.windows_done = 0
        self._step = 0  # the last step seen, for events emitted from close()

    # StepHook ------------------------------------------------------------------------------
    def setup(self, ctx: Any) -> None:
        super().setup(ctx)
        self.use_device = ctx.device.type == "cuda"
        self.sort_by = "device" if self.use_device else "cpu"
        if self.quiet:
            with contextlib.suppress(OSError):
                self._log_fd = os.open(ctx.run_dir / "stderr.log",
                                       os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    @property
    def busy(self) -> bool:
        """A window is open or its analysis is still running."""
        return self._window is not None or self._analysis is not None

    @property
    def tracing(self) -> bool:
        """The step about to run (or running) is inside a window: wait, warmup or active."""
        return self._window is not None

    def open_window(self, step: int, trigger: str = "key") -> bool:
        """Open a window at the boundary before ``step``; False when one is already busy."""
        if self.busy:
            return False
        self._open(step, trigger)
        return True

    def cancel(self, step: int, reason: str = "cancelled by user") -> bool:
        """Cancel the open window or its analysis; False when there is none."""
        if self._window is not None:
            self._cancel_window(step, reason)
        elif self._analysis is not None:
            self._cancel_analysis(step, f"{reason} during analysis")
        else:
            return False
        return True

    def step_context(self, step: int) -> contextlib.AbstractContextManager[Any]:
        self._step = step
        if self._pending_at and self._pending_at[0] <= step and not self.busy:
            while self._pending_at and self._pending_at[0] <= step:  # one window serves all
                self._pending_at.pop(0)
            self._open(step, "profile_at")  # (while busy, a --profile-at step waits its turn)
        return contextlib.nullcontext()

    def end_step(self, step: int, tensors: StepTensors, sample: StepSample) -> None:
        self._step = step
        win = self._window
        if win is not None:
            phase = self._phase_of(win.index)
            win.steps[phase].append(step)
            win.index += 1
            try:
                with stderr_to(self._log_fd):
                    win.prof.step()
            except Exception as exc:  # an instrument never takes the training down
                self._cancel_window(step, f"profiler error: {type(exc).__name__}: {exc}")
                return
            if win.index >= self.wait + self.warmup + self.active:
                self._finish_window(step)
        last = step == self.ctx.max_steps  # so its events precede run_finished
        if last and self._window is not None:
            self._cancel_window(step, "the run ended before the window was complete")
        if self._analysis is not None:
            self._poll(step, block=last)
        self._retired = [w for w in self._retired if w.poll() is None]

    def close(self) -> None:
        if self._window is not None:
            self._cancel_window(self._step, "run ended")
        if self._analysis is not None:
            if self.ctx.urgent():  # the process is leaving now: no table, no child left behind
                self._cancel_analysis(self._step, "the run was interrupted during analysis")
            else:
                self._poll(self._step, block=True)
        for worker in self._retired:
            try:
                worker.wait(0.2 if self.ctx.urgent() else 2)
            except subprocess.TimeoutExpired:
                worker.kill()
        self._retired = []
        if self._log_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._log_fd)
            self._log_fd = None

    # window --------------------------------------------------------------------------------
    def _phase_of(self, index: int) -> str:
        """The schedule's phase of the window's ``index``-th step (0-based)."""
        if index < self.wait:
            return "wait"
        return "warmup" if index < self.wait + self.warmup else "active"

    def _open(self, step: int, trigger: str) -> None:
        activities = [ProfilerActivity.CPU]
        if self.use_device:
            activities.append(ProfilerActivity.CUDA)
        prof = profile(activities=activities,
                       schedule=schedule(wait=self.wait, warmup=self.warmup, active=self.active,
                                         repeat=1),
                       record_shapes=self.record_shapes, profile_memory=self.profile_memory)
        try:
            with stderr_to(self._log_fd):
                prof.start()
        except Exception as exc:
            self._emit(R.PROFILE_CANCELLED, step,
                       {"reason": f"profiler did not start: {type(exc).__name__}: {exc}"})
            return
        self._window = win = _Window(step, trigger, prof, rank=self.ctx.rank)
        if self.analysis == "subprocess":
            out_dir = self.ctx.run_dir / win.dir_name
            try:
                win.worker = spawn_worker(
                    out_dir / TRACE_NAME, out_dir, self.sort_by, self.top_n, self.use_device,
                    self.profile_memory,
                    self._log_fd if self._log_fd is not None else subprocess.DEVNULL)
            except Exception:  # no child process here: _finish_window analyses in process
                win.worker = None
        self._emit(R.PROFILE_STARTED, step, {
            "wait": self.wait, "warmup": self.warmup, "active": self.active,
            "record_shapes": self.record_shapes, "profile_memory": self.profile_memory,
            "trigger": trigger, "dir": self._window.dir_name})

    def _stop_profiler(self, win: _Window) -> None:
        with contextlib.suppress(Exception), stderr_to(self._log_fd):
            win.prof.stop()

    def _cancel_window(self, step: int, reason: str) -> None:
        win = self._window
        self._window = None
        if win is not None:
            self._stop_profiler(win)  # nothing was written yet: the folder appears on export
            self._retire(win.worker)
            self._release(win)
        self._emit(R.PROFILE_CANCELLED, step, {"reason": reason})

    def _finish_window(self, step: int) -> None:
        """The schedule has stopped the profiler: export the trace, start the analysis."""
        win = self._window
        assert win is not None
        self._window = None
        self._stop_profiler(win)  # leaves the ProfilerStep range the last step() opened
        # The schedule's stop (in the last prof.step()) and the export are two C++ calls that
        # each hold the GIL for tens of ms (35-67 and 29-47 ms for the default window on two
        # cores, RESULTS.md issue 28): back to back they stalled the UI thread ~145 ms. A breath
        # between them lets the UI run, so its longest wait is the longer call, not the sum.
        time.sleep(GIL_BREATH_S)
        out_dir = self.ctx.run_dir / win.dir_name
        try:
            export_s = export_trace(win.prof, out_dir, self._window_info(win))
        except Exception as exc:  # e.g. disk full: no half-written trace is left behind
            self._retire(win.worker)
            self._release(win)
            self._emit(R.PROFILE_CANCELLED, step, {
                "reason": f"trace export failed: {type(exc).__name__}: {exc}",
                "dir": win.dir_name})
            return
        self._emit(R.PROFILE_ANALYSING, step, {"dir": win.dir_name, "export_s": export_s})
        if self.keep_profiler:
            self.last_profiler = win.prof
        ana = _Analysis(win, out_dir, None, export_s, time.perf_counter())
        if win.worker is not None and win.worker.stdin is not None:
            try:
                win.worker.stdin.write(b"go\n")
                win.worker.stdin.close()
                ana.proc = win.worker
            except (OSError, ValueError):  # it died: analyse in process
                self._retire(win.worker)
        if ana.proc is None:  # (stalls a UI thread in this process ~0.3-1 s)
            try:
                ana.result = analyse_in_process(
                    win.prof, out_dir, sort_by=self.sort_by, top_n=self.top_n,
                    use_device=self.use_device, profile_memory=self.profile_memory)
            except Exception as exc:
                self._release(win)
                self._emit(R.PROFILE_CANCELLED, step, {
                    "reason": f"analysis failed: {type(exc).__name__}: {exc}",
                    "dir": win.dir_name})
                return
        self._release(win)
        self._analysis = ana
        self._poll(step, block=False)

    def _window_info(self, win: _Window) -> dict[str, Any]:
        cfg, gpt = self.ctx.config, self.ctx.model_shape
        return {
            "schedule": {"wait": self.wait, "warmup": self.warmup, "active": self.active,
                         "repeat": 1},
            "record_shapes": self.record_shapes, "profile_memory": self.profile_memory,
            "with_stack": False,
            "activities": ["CPU", "CUDA"] if self.use_device else ["CPU"],
            "batch_size": cfg.get("batch_size"), "seq_len": cfg.get("seq_len"),
            "model": ({k: getattr(gpt, k) for k in ("layers", "heads", "dim", "attention")}
                      if gpt is not None else {"class": type(self.ctx.model).__name__}),
            "amp": self.ctx.amp, "device": str(self.ctx.device),
            "device_name": (torch.cuda.get_device_name(self.ctx.device) if self.use_device
                            else "CPU"),
            "torch_version": torch.__version__,
            "trigger": win.trigger, "first_step": win.first_step, "steps": win.steps,
            "trace": TRACE_NAME, "sort_by": self.sort_by,
        }

    # analysis ------------------------------------------------------------------------------
    def _poll(self, step: int, block: bool) -> None:
        ana = self._analysis
        assert ana is not None
        if ana.proc is not None and ana.result is None:
            if block:
                try:
                    ana.proc.wait(max(0.0, self.analysis_timeout_s
                                      - (time.perf_counter() - ana.started)))
                except subprocess.TimeoutExpired:
                    pass
            code = ana.proc.poll()
            if code is None:
                if time.perf_counter() - ana.started < self.analysis_timeout_s:
                    return
                self._cancel_analysis(step, f"analysis took over {self.analysis_timeout_s:.0f} s")
                return
            try:
                if code != 0:
                    raise RuntimeError(f"analysis worker exited with status {code}; "
                                       "see stderr.log in the run folder")
                with open(ana.out_dir / "top_ops.json", encoding="utf-8") as fh:
                    ana.result = json.load(fh)
            except Exception as exc:
                self._analysis = None
                self._emit(R.PROFILE_CANCELLED, step, {
                    "reason": f"analysis failed: {exc}", "dir": ana.window.dir_name})
                return
        self._analysis = None
        result = ana.result or {}
        self.windows_done += 1
        self._emit(R.PROFILE_DONE, step, {
            "dir": ana.window.dir_name, "sort_by": result.get("sort_by", self.sort_by),
            "top_ops": result.get("top_ops", []), "phases": result.get("phases", []),
            "device_time": result.get("device_time"), "analysis_s": result.get("analysis_s"),
            "trace": TRACE_NAME, "table": "top_ops.txt", "export_s": ana.export_s,
            "wall_s": time.perf_counter() - ana.started, "steps": ana.window.steps["active"],
            "first_step": ana.window.first_step, "in_process": ana.proc is None})

    def _cancel_analysis(self, step: int, reason: str) -> None:
        ana = self._analysis
        if ana is not None and ana.proc is not None and ana.proc.poll() is None:
            ana.proc.kill()
            with contextlib.suppress(Exception):
                ana.proc.wait(5)
            for tmp in ana.out_dir.glob("*.tmp"):  # a table it was writing: not half-kept
                with contextlib.suppress(OSError):
                    tmp.unlink()
        self._analysis = None
        self._emit(R.PROFILE_CANCELLED, step, {
            "reason": reason, "dir": ana.window.dir_name if ana else None})

    # helpers -------------------------------------------------------------------------------
    def _retire(self, worker: subprocess.Popen[bytes] | None) -> None:
        """An idle worker whose window will not need it: EOF on stdin makes it exit."""
        if worker is None:
            return
        with contextlib.suppress(Exception):
            if worker.stdin is not None:
                worker.stdin.close()
        self._retired.append(worker)

    def _release(self, win: _Window) -> None:
        """Free the window's profiler, then hand its memory back (issue 28). torch's profile
        object sits in reference cycles: dropping it freed nothing until a later gc pass, after
        the trim, and its buffers stayed as RSS in the trainer's arena (RESULTS.md, "the
        profiler's cycle"). A young collection frees it (6-30 ms), a full one (~46 ms beside the
        dashboard, ~120 ms unfrozen) only if it grew old; the trim releases the GIL."""
        prof, win.prof = win.prof, None
        if prof is None or prof is self.last_profiler:  # kept for the caller (keep_profiler)
            return
        ref = weakref.ref(prof)
        del prof
        gc.collect(1)
        if ref() is not None:
            gc.collect()
        if self.trim_heap:
            self.trimmed.append(trim_heap())

    def _emit(self, name: str, step: int, data: dict[str, Any]) -> None:
        self.ctx.emit(Event(name, step, self.ctx.elapsed_s(), data))

