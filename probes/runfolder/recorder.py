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
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from probes import records as R
from probes.records import Event, Record, StepSample
from probes.runfolder.atomic import write_json
from probes.runfolder.layout import CONFIG, metrics_name
from probes.runfolder.state import RunState
from probes.runfolder.writer import MetricsWriter

Sink = Callable[[Record], None]

# a step row handed over with ``publish_soon`` waits at most this long (or for MAX_SOON_ROWS
# rows) before the publishing thread publishes it with the rows before it, in one batch: the
# same work per row, done warm (~40 µs a row one at a time after a step's torch work, ~23 in a
# batch: benchmarks/RESULTS.md, issue 28). An event published on that thread goes after them.
DRAIN_EVERY_S = 0.05
MAX_SOON_ROWS = 8
RowCallback = Callable[[StepSample, Any], None]


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
        # publish_soon's rows: (sample, what on_row is given with it); deque: atomic appends
        self._soon: deque[tuple[StepSample, Any]] = deque()
        self._soon_thread: int | None = None  # the thread that hands rows over (the loop's)
        self._drained_at = time.perf_counter()
        self._draining = False
        self.on_row: RowCallback | None = None  # after each batched row: the Monitor's hooks

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

    def publish_soon(self, sample: StepSample, extra: Any = None, drain: bool = True) -> None:
        """A step row, published within DRAIN_EVERY_S by this same thread, in order, and then
        ``on_row(sample, extra)``. An event published meanwhile by this thread, ``flush()``,
        ``drain()`` and ``close()`` publish the waiting rows first; ``seal()`` writes them.
        ``drain=False``: the caller drains at its next ``drain_if_due`` (a CUDA Monitor, before
        its next step's wait)."""
        if self._soon_thread is None:
            self._soon_thread = threading.get_ident()
        soon = self._soon
        soon.append((sample, extra))
        if drain and (len(soon) >= MAX_SOON_ROWS
                      or time.perf_counter() - self._drained_at >= DRAIN_EVERY_S):
            self.drain()

    def drain_if_due(self) -> None:
        """Publish the waiting rows now if publish_soon would at its next call (8 rows, or
        DRAIN_EVERY_S since the last batch): a CUDA loop's Monitor calls it before the step's
        one wait, so the batch's work overlaps the device's instead of following the sync
        (issue 45); the row handed over after the wait then waits for the next batch."""
        soon = self._soon
        if soon and (len(soon) >= MAX_SOON_ROWS - 1
                     or time.perf_counter() - self._drained_at >= DRAIN_EVERY_S):
            self.drain()

    @property
    def rows_waiting(self) -> int:
        """Step rows handed to publish_soon and not published yet."""
        return len(self._soon)

    def drain(self) -> None:
        """Publish the rows publish_soon holds, each followed by ``on_row``. Only the thread
        that handed them over drains (on_row runs the loop's instruments, which use torch);
        a call from another thread, or from inside on_row, does nothing."""
        if self._draining or threading.get_ident() != self._soon_thread:
            return
        self._draining = True
        try:
            soon, on_row = self._soon, self.on_row
            while soon:
                sample, extra = soon.popleft()
                self.publish(sample)
                if on_row is not None:
                    on_row(sample, extra)
        finally:
            self._draining = False
            self._drained_at = time.perf_counter()

    def publish(self, record: Record) -> None:
        if self._soon and type(record) is not StepSample:
            self.drain()  # the rows before an event go first (on the loop's thread)
            if self._soon and getattr(record, "event", None) == R.RUN_FINISHED:
                self.publish_waiting_rows()  # the run ended from another thread: rows first
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
        self.drain()
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
            self.publish_waiting_rows()
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

    def publish_waiting_rows(self) -> None:
        """The run ends from another thread (seal(), close(), run_finished, a stuck step's
        error row from RunSession.abandon): the rows
        publish_soon still holds are published, not given to on_row (the loop's instruments
        stay on the loop's thread). No row already measured is lost."""
        while self._soon:
            sample, _ = self._soon.popleft()
            self.publish(sample)

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
        self.drain()
        self.publish_waiting_rows()  # closed from another thread: the rows still go in
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
