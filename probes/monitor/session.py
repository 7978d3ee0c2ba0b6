"""One process's run, whatever its loop: the part every writer of a run folder shares.

The Monitor (probes/monitor/monitor.py), memtop's inference runner (trainer/infer.py) and,
through the Monitor, the framework callbacks (probes/integrations/) all need the same pieces
around their steps: the recorder (run folder and in-process sinks), the control object and the
request socket, the NVML poller on CUDA, the device's facts in run_started, request dispatch at
a step boundary (pause, resume, stop, report, a memory snapshot, and the writer's own kinds),
one StepSample from a memory reading, and an orderly close. A writer adds only what its loop
knows: its instruments, its run_started fields, its request kinds and its step's own values.

    session = RunSession(run_dir, config=cfg, sinks=[ring.push])
    session.open(device)                           # memory probe, NVML poller (CUDA)
    session.offer("profile", lambda step: ...)     # a request kind this writer acts on
    session.listen()                               # the request socket, mode 0600
    session.start(amp="bf16", params=n, mode="infer")
    while not session.boundary(session.step + 1):  # due requests, pauses; True: stop
        session.step += 1
        ...; session.recorder.publish(session.step_sample(session.step, reading, step_s,
                                                          amp="bf16", tokens_in_step=B * T))
    session.close()                                # run_finished, threads stopped
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from probes import records as R
from probes.control.requests import Request, RunControl
from probes.control.unix_socket import ControlServer
from probes.counters.cudamem import dump_snapshot, failure_artifacts, start_history, stop_history
from probes.counters.device_index import indexed_device
from probes.counters.host import cpu_bf16_override, host_ram_bytes
from probes.counters.memory import MemoryProbe
from probes.counters.nvml import NvmlPoller
from probes.counters.sysinfo import system_info
from probes.counters.workers import ProcessTreeSampler, WorkersReading
from probes.instruments.hooks import RunContext
from probes.monitor.steprow import StepRows
from probes.records import Event
from probes.runfolder import socket_name
from probes.runfolder.recorder import RunRecorder, Sink
from probes.runfolder.state import RunState
from probes.traces.worker import analysis_pids, kill_workers

BUILTIN_REQUESTS = ("pause", "resume", "stop", "report")  # every session acts on these


class RunSession(StepRows):
    """The recorder, control, socket, counters and request dispatch of one process's run.

    Built where the writer is built (the dashboard reads ``state`` before the run's thread
    starts); ``open(device)`` and everything after it run on the run's own thread. ``label``
    names the run in refusals ("this inference run cannot do 'leak_start'").
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, rank: int | None = None,
                 sinks: Iterable[Sink] = (), config: dict[str, Any] | None = None,
                 control: RunControl | None = None, label: str = "run") -> None:
        self.control = control or RunControl()
        self.recorder = RunRecorder(run_dir, rank=rank, sinks=sinks, config=config,
                                    on_write_failed=self.control.stop)
        self.run_dir: Path = self.recorder.run_dir
        self.rank = rank
        self.label = label
        self.step = 0  # the writer's step count: the ping answer and run_finished say it
        self._heap_step: int | None = None  # the last step whose row read the heap itself
        self.failed_step: int | None = None  # the step whose error row was written
        self.closed = False
        self.device: torch.device | None = None
        self.memory: MemoryProbe | None = None
        self.nvml: NvmlPoller | None = None
        self.workers: ProcessTreeSampler | None = None  # this process's children (workers)
        self.workers_fresh: WorkersReading | None = None  # the last row's, when new to it
        self._workers_seq = 0
        self.server: ControlServer | None = None
        self.device_name = ""
        self.device_total_bytes: int | None = None  # device memory (CUDA) or host RAM (CPU)
        self.memory_history = "off"  # CUDA allocation history: what run_started records
        # fields a writer that hands its session to a Monitor adds to run_started (amp_reason)
        self.run_started_extra: dict[str, Any] = {}
        self._handlers: dict[str, Callable[[int], object]] = {}
        self.metrics: Any = None  # the /metrics endpoint (probes/export), when one is served

    @property
    def state(self) -> RunState:
        """The run's state as its records tell it (probes/runfolder/state.py): read on the
        loop's thread, with every finished step's row in it; from another thread, up to the
        recorder's DRAIN_EVERY_S behind (probes/runfolder/recorder.py publish_soon)."""
        self.recorder.drain()
        return self.recorder.state

    # set-up, on the run's thread --------------------------------------------------------------
    def open(self, device: torch.device, *, memory_history: bool = False,
             workers_sample_s: float | None = 1.0) -> MemoryProbe:
        """The device's counters: a memory probe, the workers' sampler (its own thread, every
        ``workers_sample_s``; None: off), on CUDA the NVML poller (its own thread) and, when
        asked, the allocator's history (probes/counters/cudamem.py). A CUDA device without an
        index is the current one from here on (probes/counters/device_index.py)."""
        device = indexed_device(device)
        self.device = device
        if workers_sample_s is not None:
            self.workers = ProcessTreeSampler(interval_s=workers_sample_s,
                                              exclude=analysis_pids)
            self.workers.start()
        self._device_text = str(device)  # every step row's "device"
        self.memory = MemoryProbe(device)
        if device.type == "cuda":
            self.recorder.encode_rows_in_thread()  # off the step path (issue 28)
            self.nvml = NvmlPoller.for_cuda_device(device)
            self.nvml.start()
            self.device_total_bytes = torch.cuda.get_device_properties(device).total_memory
            self.device_name = torch.cuda.get_device_name(device)
        else:
            self.device_total_bytes, self.device_name = host_ram_bytes(), "CPU"
        self.memory_history = start_history(device, memory_history)
        return self.memory

    def context(self, model: torch.nn.Module, optimizer: Any, scaler: Any, amp: str,
                **options: Any) -> RunContext:
        """What the instruments see of this run (probes/instruments/hooks.py); ``options``
        are RunContext's keywords (warmup_steps, max_steps, model_shape, config)."""
        assert self.device is not None and self.memory is not None, "open() the session first"
        return RunContext(model, optimizer, scaler, self.device, amp, self.run_dir, self.memory,
                          self.recorder.publish, self.recorder.elapsed_s,
                          self.device_total_bytes, rank=self.rank,
                          urgent=lambda: self.control.urgent, offer=self.offer,
                          memory_history=self.memory_history, workers=self.workers,
                          **options)

    def offer(self, kind: str, handler: Callable[[int], object]) -> None:
        """Act on request ``kind`` at a step boundary with ``handler(step about to run)``;
        announced in run_started and answered by the socket, in the order offered."""
        self._handlers[kind] = handler

    def listen(self) -> None:
        """Open the run's request socket (a daemon thread; never on the step path)."""
        self.server = ControlServer(self.run_dir / socket_name(self.rank), self.control,
                                    self.status, self.refuse)
        self.server.start()

    def start(self, **fields: Any) -> Event:
        """run_started: the device's and the session's facts, with the writer's ``fields``
        (amp, params and what only it knows) between them."""
        device, nvml, server = self.device, self.nvml, self.server
        resolved: dict[str, Any] = {"resolved_device": str(device)}
        if isinstance(fields.get("amp"), str) and fields["amp"] != "auto":
            resolved["resolved_amp"] = fields["amp"]  # else the loop's first forward says it
        self.recorder.add_to_config(**resolved)
        return self.emit(R.RUN_STARTED, 0, {
            "device": str(device), "device_name": self.device_name,
            "device_total_bytes": self.device_total_bytes,
            "counters": self.memory.counter_source if self.memory else None,
            "driver_counter": driver_label(device, nvml),
            "memory_history": self.memory_history,
            "workers_counter": self.workers.describe() if self.workers else "off",
            "nvml_error": nvml.error if nvml else None,
            "nvml_match": nvml.match if nvml else None,
            "mig": nvml.is_mig if nvml and nvml.available else None,
            "cpu_bf16_override": cpu_bf16_override() if device.type == "cpu" else None,
            **self.run_started_extra, **fields, "pid": os.getpid(),
            "host": socket.gethostname(),  # the metrics exporter's host label (probes/export)
            "socket": server.path.name if server and not server.error else None,
            "socket_error": server.error if server else "not listening",
            "requests": self.capabilities(), "system": system_info(device)})

    def serve_metrics(self, endpoint: Any, world_size: int = 1) -> None:
        """Answer Prometheus on ``endpoint`` (a bound probes.export.MetricsEndpoint) from its
        own thread: a lone process from the state its recorder already folds (nothing on the
        step path), local rank 0 of several from the run folder's files of this machine's
        ranks (one endpoint per node; prometheus_client's multiprocess mode is not used)."""
        import socket as sockets

        from probes.export import FolderCollector, RecorderCollector

        collector = RecorderCollector(self.recorder) if world_size <= 1 else \
            FolderCollector([self.run_dir], only_host=sockets.gethostname())
        self.metrics = endpoint.serve(collector)

    # the run ----------------------------------------------------------------------------------
    def emit(self, name: str, step: int | None = None, data: dict[str, Any] | None = None) \
            -> Event:
        """Write an event row (one of probes.records.EVENT_KINDS, or the writer's own)."""
        return self.recorder.emit(name, self.step if step is None else step, data)

    def record_error(self, step: int, exc: BaseException) -> None:
        """The run's error row, with what explains it on CUDA (memory summary, snapshot)."""
        self.failed_step = step
        data: dict[str, Any] = {
            "error_type": type(exc).__name__, "message": str(exc),
            "traceback": "".join(traceback.format_exception(type(exc), exc,
                                                            exc.__traceback__))}
        data.update(failure_artifacts(self.run_dir, self.device, self.memory_history))
        with contextlib.suppress(Exception):
            self.emit(R.ERROR, step, data)

    # step boundaries --------------------------------------------------------------------------
    def boundary(self, step: int) -> bool:
        """Before ``step`` runs: act on due requests, then wait while paused (and act on what
        came in meanwhile). True when the run is asked to stop."""
        for req in self.control.take_due(step):
            self.act(req, step)
        if self.control.paused and not self.control.stop_requested:
            self.emit(R.PAUSED, step - 1,
                      {"source": self.control.paused_by or "keyboard"})
            t0 = time.perf_counter()
            self.control.wait_while_paused()
            self.emit(R.RESUMED, step - 1, {"paused_s": time.perf_counter() - t0})
            for req in self.control.take_due(step):
                self.act(req, step)
        return self.control.stop_requested

    def act(self, req: Request, step: int) -> None:
        """One request, at the boundary before ``step``: recorded, then done."""
        self.emit(R.CONTROL, step - 1, {"request": req.kind, "source": req.source,
                                        "at_step": req.at_step})
        if req.kind == "pause":
            self.control.pause(req.source)
        elif req.kind == "resume":
            self.control.resume()
        elif req.kind == "stop":
            self.control.stop(req.reason or f"stopped by {req.source}")
        elif req.kind == "report":
            self._write_report_async(step)
        elif req.kind == "memory_snapshot":  # answered on CPU too: the row says why not
            self.emit(R.MEMORY_SNAPSHOT, step - 1,
                      dump_snapshot(self.run_dir, self.device, step - 1, self.memory_history))
        elif req.kind in self._handlers:
            self._handlers[req.kind](step)

    def _write_report_async(self, step: int) -> None:
        """report.md/json off the step path (it reads the whole metrics file, so the rows
        still waiting for their batch's flush go first)."""
        self.recorder.flush()

        def write() -> None:
            from probes.analysis.report.build import write_report

            try:
                path = write_report(self.run_dir)
            except Exception:
                return
            with contextlib.suppress(Exception):
                self.emit(R.REPORT_WRITTEN, step - 1, {"path": path.name})

        threading.Thread(target=write, name="memtop-report", daemon=True).start()

    # the socket's side ------------------------------------------------------------------------
    def capabilities(self) -> list[str]:
        caps = list(BUILTIN_REQUESTS)
        if self.device is not None and self.device.type == "cuda":
            caps.append("memory_snapshot")
        return caps + list(self._handlers)

    def refuse(self, req: Request) -> str | None:
        caps = self.capabilities()
        if req.kind not in caps:
            return f"this {self.label} cannot do {req.kind!r} (it can: {', '.join(caps)})"
        return None

    def status(self) -> dict[str, Any]:
        last = self.recorder.state.last_sample  # its step time: how far ahead ranks agree
        return {"pid": os.getpid(), "rank": self.rank, "step": self.step,
                "state": self.recorder.state.state, "paused": self.control.paused,
                "step_ms": last.step_ms if last is not None else None,
                "requests": self.capabilities()}

    # the end ----------------------------------------------------------------------------------
    def close(self, reason: str | None = None) -> None:
        """run_finished ("failed" after an error row, else ``reason``, the stop's reason or
        "finished"), then the socket, the poller, the allocator history and the file closed.
        The writer closes its instruments first. Safe to call twice; never raises."""
        if self.closed:
            return
        self.closed = True
        failed = self.failed_step is not None
        why = "failed" if failed else (reason or self.control.stop_reason or "finished")
        data: dict[str, Any] = {"reason": why}
        if self.memory is not None and not self.memory.is_cuda:  # the CPU's sampled peak
            data["mid_step_heap_reads"] = self.memory.mid_step_reads
            data["mid_step_heap_reads_skipped"] = self.memory.mid_step_skipped
        if self.workers is not None and self.workers.has_changes:  # seen since the last row
            with contextlib.suppress(Exception):
                self.note_workers(self.step, self.workers.latest)
        with contextlib.suppress(Exception):
            self.emit(R.RUN_FINISHED, self.step, data)
        if self.server is not None:
            self.server.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.nvml is not None:
            self.nvml.stop()
        if self.workers is not None:
            self.workers.stop()
        stop_history(self.memory_history)
        if self.memory is not None:
            self.memory.close()
        self.recorder.close()

    def abandon(self, reason: str, abandoned_step: int | None = None,
                stuck: str | None = None) -> bool:
        """The process leaves while the run's thread is still busy (a step, or the run's end,
        that did not finish in time): kill the profiler's analysis children and seal
        metrics.jsonl with run_finished, from the calling thread; whatever the run's thread
        writes later is dropped. ``stuck``: the step will never finish (a collective waiting
        for a rank that ended): an error row says why and the run ends "failed", as it does
        when the collective raises instead. False when the file could not be sealed (a row
        write hung)."""
        kill_workers()
        why = self.control.stop_reason or reason
        if stuck is not None:
            self.failed_step = abandoned_step if abandoned_step is not None else self.state.step
            self.recorder.publish_waiting_rows()  # the rows measured before it go first
            with contextlib.suppress(Exception):
                self.emit(R.ERROR, self.failed_step,
                          {"error_type": "StuckStep", "message": stuck})
            why = "failed"
        elif abandoned_step is not None:
            why += f"; step {abandoned_step} was abandoned unfinished"
        sealed = self.recorder.seal(why, self.state.step, abandoned_step=abandoned_step)
        if self.server is not None:
            self.server.close(wait_s=0)  # the socket file goes: viewers see a run that ended
        return sealed


def driver_label(device: torch.device | None, nvml: NvmlPoller | None) -> str:
    """What the driver-level counter is, in words (run_started, the report's measurements)."""
    if device is None or device.type != "cuda":
        return "process RSS (/proc/self/statm)"
    if nvml is not None and nvml.match.startswith("not matched"):
        return "n/a (NVML device not matched to the CUDA device; no index is guessed)"
    if nvml is None or not nvml.available:
        return "n/a (NVML unavailable)"
    return "NVML memory of this process (all processes' when the pid is not visible)"
