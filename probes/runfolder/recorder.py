"""Where a run's records go: its metrics file, and the in-process sinks (a dashboard's ring,
headless output). Any thread may publish; a failing sink is dropped, a failing disk stops the
run cleanly (every row already written stays valid).

A process that must end while its training thread is stuck in a step (the terminal went away,
the step does not finish in time) seals the file from another thread: ``run_finished`` is then
the last row, and whatever the abandoned step publishes later is dropped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from probes import records as R
from probes.records import Event, Record
from probes.runfolder.atomic import write_json
from probes.runfolder.layout import CONFIG, metrics_name
from probes.runfolder.state import RunState
from probes.runfolder.writer import MetricsWriter

Sink = Callable[[Record], None]


class RunRecorder:
    """Writes one process's records into the run folder and passes them on to sinks.

    ``state`` is the run's state folded from everything published (probes/runfolder/state.py).
    ``on_write_failed(reason)`` is called once if the metrics file cannot be written.
    """

    def __init__(self, run_dir: str | Path, *, rank: int | None = None,
                 sinks: Iterable[Sink] = (), config: dict[str, Any] | None = None,
                 on_write_failed: Callable[[str], None] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.sinks: list[Sink] = list(sinks)
        self.sink_errors: list[str] = []
        self.write_failed = False
        self.on_write_failed = on_write_failed
        self.state = RunState()
        self._t0 = time.perf_counter()
        # rank 0 (or a lone process) writes the config
        self._config = dict(config) if config is not None and not rank else None
        if self._config is not None:
            write_json(self.run_dir / CONFIG, self._config)
        self.metrics_path = self.run_dir / metrics_name(rank)
        self._writer: MetricsWriter | None = MetricsWriter(self.metrics_path)
        self._lock = threading.RLock()  # one row at a time; seal() waits for the row in flight
        self.finished_written = False  # run_finished is in the file
        self.sealed = False  # nothing more goes into the file (see seal())

    def add_to_config(self, **values: Any) -> None:
        """Rewrite config.json with ``values`` beside the options as given: what is known only
        once the run has started on this machine (``resolved_device``, ``resolved_amp``).
        Atomic; a config that cannot be rewritten keeps the options (the rows say the rest)."""
        if self._config is None or all(self._config.get(k) == v for k, v in values.items()):
            return
        self._config.update(values)
        with contextlib.suppress(OSError):
            write_json(self.run_dir / CONFIG, self._config)

    def elapsed_s(self) -> float:
        return time.perf_counter() - self._t0

    def emit(self, name: str, step: int, data: dict[str, Any] | None = None) -> Event:
        event = Event(name, step, self.elapsed_s(), dict(data or {}), self.rank or 0)
        self.publish(event)
        return event

    def publish(self, record: Record) -> None:
        if self.rank and isinstance(record, Event) and record.rank != self.rank:
            # an instrument's event (profiler window, ledger, leak watch, hints) is built
            # without a rank: this process's rank, or rank 1's window read back as rank 0's
            record = dataclasses.replace(record, rank=self.rank)
        with self._lock:
            if self.sealed:
                return  # the run was ended from outside: run_finished stays the last row
            writer = self._writer
            if writer is not None:
                try:
                    writer.write(record)
                except OSError as exc:  # disk full, file system gone: stop cleanly
                    self._failed(exc, record)
            if isinstance(record, Event) and record.event == R.RUN_FINISHED:
                self.finished_written = True
        self.state.apply(record)
        self._to_sinks(record)

    def encode_rows_in_thread(self) -> None:
        """Step rows are encoded by the writer's thread from now on (CUDA runs, where the
        host heap is not the step's allocated counter: probes/runfolder/writer.py)."""
        if self._writer is not None:
            self._writer.encode_in_thread = True

    def flush(self) -> None:
        """Put every row published so far into the file (rows are flushed in batches: a reader
        in this process, such as a report written mid-run, calls this first)."""
        writer = self._writer
        if writer is not None:
            writer.flush()

    def seal(self, reason: str, step: int, abandoned_step: int | None = None,
             timeout_s: float = 1.0) -> bool:
        """End the file from any thread: run_finished (unless written already), then no more
        rows. For a process that leaves while its training thread is still inside a step.

        Waits at most ``timeout_s`` for a row being written; False when it could not seal.
        """
        if not self._lock.acquire(timeout=timeout_s):
            return False
        try:
            if self.sealed:
                return True
            if not self.finished_written:
                data: dict[str, Any] = {"reason": reason}
                if abandoned_step is not None:
                    data["abandoned_step"] = abandoned_step
                event = Event(R.RUN_FINISHED, step, self.elapsed_s(), data, self.rank or 0)
                writer = self._writer
                if writer is not None:
                    try:
                        writer.write(event)
                    except (OSError, ValueError):
                        pass
                self.finished_written = True
                self.state.apply(event)
            self.sealed = True
            self.close()
            return True
        finally:
            self._lock.release()

    def _to_sinks(self, record: Record) -> None:
        """A sink that fails (a closed pipe, a UI bug) is dropped; it never stops the run.

        A failed ``assert`` is the exception: it is a bug (a test's check in its sink, or an
        invariant of memtop's own), so it propagates and fails the step instead of letting the
        run go on without the code that was meant to check it.
        """
        for sink in list(self.sinks):
            try:
                sink(record)
            except AssertionError:
                self.sinks.remove(sink)
                raise
            except Exception as exc:
                self.sinks.remove(sink)
                self.sink_errors.append(f"{type(exc).__name__}: {exc}")

    def _failed(self, exc: OSError, record: Record) -> None:
        writer, self._writer = self._writer, None  # stop writing; earlier rows are complete
        saved = max(0, record.step - 1)
        if writer is not None:
            saved = min(saved, writer.flushed_step)  # step rows are flushed in batches
            writer.close()
        self.write_failed = True
        reason = (f"cannot write {self.metrics_path}: {exc.strerror or exc}; training stopped, "
                  f"rows up to step {saved} are saved")
        self._to_sinks(Event(R.METRICS_WRITE_FAILED, record.step, self.elapsed_s(),
                             {"reason": reason}, self.rank or 0))
        if self.on_write_failed is not None:
            self.on_write_failed(reason)

    def close(self) -> None:
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
