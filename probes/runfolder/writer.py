"""metrics.jsonl written: one JSON object a line, appended; step rows batched and flushed by time.

A step row costs the step path its JSON line (one %-format call of a template made once per shape of
row, probes/runfolder/rowline.py; the encoder for anything else) and a copy into a buffer made once,
which is written every ``flush_interval_s``. On CUDA runs (``encode_in_thread``, set by
RunSession.open) the step path only queues the row's values (one C call,
``StepSample.training_values``) and the writer's thread (``_Flusher``, one for every open writer)
encodes them within ``ENCODE_EVERY_S`` (it polls; the step path never wakes it): ~20 µs of a step's
host time (issue 28). Not on CPU: there the "allocated" counter is glibc's heap in use, read by the
training thread while that thread would be encoding, and what the encoder holds and leaves in its
own malloc caches moved a CPU leak alert's first step by one in 5 of 6 runs
(tests/unit/test_leak_trainer.py; 0 of 4 encoding on the publishing thread). A queued row is a tuple
of ~0.6 KB of pymalloc objects, at most ``MAX_QUEUED_ROWS`` of them (a full queue is encoded by the
publisher). An event is written at once, with every row queued before it: events are rare and are
what live readers wait for (profile_started, paused, a leak alert, run_finished). The one periodic
kind, the ledger's measurement (every 50 steps, ≥ 2 s apart), waits for the next flush instead. The
order of the file is the order of publishing; ``flush_interval_s=0`` writes each row at once.

What can be lost: nothing on a normal exit, an exception, or an interpreter exit without
close() (close() flushes; an atexit hook flushes every writer still open). A process killed
with SIGKILL (or by the OOM killer) loses the step rows published since the last flush: at most
``flush_interval_s`` of rows and the last ~``ENCODE_EVERY_S`` (twice the interval when no step
ends meanwhile); see RESULTS.md, issue 28, and the real ``kill -9`` in
tests/unit/test_metrics_writer.py. Every line on disk is complete but possibly the last one,
which readers skip as a truncated line.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Any

from probes import records as R
from probes.records import STEP_FIELDS, Record, StepSample
from probes.runfolder.atomic import json_safe
from probes.runfolder.rowline import training_line

FLUSH_INTERVAL_S = 0.5  # the most of step rows a SIGKILL can take with it
BUFFER_BYTES = 1 << 20  # ~1,500 step rows: a row waits for the interval or for a full buffer
# the writer's thread looks for queued rows this often: polled, never woken from the step path
# (waking it from each step, an Event.set, cost ~60 µs a step on 10 ms steps: the GIL went to it)
ENCODE_EVERY_S = 0.05
MAX_QUEUED_ROWS = 1024  # rows waiting to be encoded; more and the publishing thread encodes them
BATCHED_EVENTS = frozenset({R.LEDGER})  # periodic: they wait for the flush; other events do not

# made once: json.dumps with keywords builds a new encoder per call (~1 µs of the step path)
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str, allow_nan=False)
_SAFE_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)


def json_line(row: dict[str, Any]) -> str:
    """One metrics.jsonl line (without the newline)."""
    try:  # the usual row has no inf/nan: encoded as is (the per-step path, no copy)
        return _ENCODER.encode(row)
    except ValueError:
        return _SAFE_ENCODER.encode(json_safe(row))


def step_line(values: tuple[Any, ...]) -> str:
    """A training step row's line from its values (``StepSample.training_values``): one
    %-format call where the row's shape allows (probes/runfolder/rowline.py: durations to 9
    significant digits), the encoder otherwise."""
    line = training_line(values)
    return line if line is not None else json_line(dict(zip(STEP_FIELDS, values, strict=True)))


class MetricsWriter:
    """Appends one JSON object per line; safe to call from any thread.

    Rows wait in a fixed buffer for about ``flush_interval_s`` (0: every row is written at
    once, as before issue 28); events but BATCHED_EVENTS flush at once. The module docstring
    says what a kill loses. ``flushes`` counts the file writes, ``flushed_step`` is the last
    step on disk.
    """

    def __init__(self, path: Path, flush_interval_s: float = FLUSH_INTERVAL_S,
                 buffer_bytes: int = BUFFER_BYTES, encode_in_thread: bool = False) -> None:
        if not flush_interval_s >= 0:
            raise ValueError(f"flush_interval_s must be zero or positive, got {flush_interval_s}")
        self.path = Path(path)
        self.flush_interval_s = flush_interval_s
        # step rows encoded by the writer's thread (CUDA runs: RunSession.open sets it); on CPU
        # they are encoded on the publishing thread, see the module docstring for why
        self.encode_in_thread = encode_in_thread
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()
        # made once: the rows waiting never change the heap (the CPU's "allocated" counter)
        self._buf = bytearray(buffer_bytes)
        self._view = memoryview(self._buf)
        self._used = 0
        self._pending_step = 0  # the step of the last row in the buffer
        self._last_flush = time.monotonic()
        self._deferred: OSError | None = None  # the background flush failed: the next write says
        self.flushes = 0  # file writes so far (each one write of the buffered lines)
        self.flushed_step = 0  # the step of the last row on disk
        # step rows' values waiting for the writer's thread (deque: append and popleft are
        # atomic, so the publishing thread never takes the lock for a step row)
        self._queued: deque[tuple[Any, ...]] = deque()
        if flush_interval_s > 0:
            _FLUSHER.add(self)

    def write_row(self, row: dict[str, Any], urgent: bool = True) -> None:
        """One row; ``urgent`` rows (events) reach the file before this returns."""
        self._write_line(json_line(row), row.get("step", self._pending_step), urgent)

    def _write_line(self, line: str, step: int, urgent: bool) -> None:
        data = (line + "\n").encode("utf-8")
        with self._lock:
            if self._deferred is not None:
                raise self._deferred
            if self._fd is None:
                return
            self._add_locked(data)
            self._pending_step = step
            if urgent or time.monotonic() - self._last_flush >= self.flush_interval_s:
                self._flush_locked()

    def write(self, record: Record) -> None:
        if type(record) is StepSample and self.encode_in_thread and self.flush_interval_s > 0:
            values = record.training_values()
            if values is not None:  # a training row: queued for the writer's thread
                if self._deferred is not None:
                    raise self._deferred
                queued = self._queued
                queued.append(values)
                if len(queued) >= MAX_QUEUED_ROWS:
                    self.encode_queued()  # faster than the writer's thread polls: encode here
                return
        urgent = type(record) is not StepSample and \
            getattr(record, "event", None) not in BATCHED_EVENTS
        if self._queued:
            self.encode_queued()  # the file keeps the order of publishing
        if type(record) is StepSample:
            values = record.training_values()
            if values is not None:
                self._write_line(step_line(values), values[0], urgent)
                return
        self.write_row(record.to_json(), urgent=urgent)

    @property
    def queued_rows(self) -> int:
        """Step rows waiting to be encoded (the writer's thread takes them within
        ENCODE_EVERY_S)."""
        return len(self._queued)

    def encode_queued(self) -> None:
        """Encode the queued step rows into the buffer (the writer's thread, a full queue, an
        event or a flush), in their order; flushes when the interval has passed."""
        queued = self._queued
        with self._lock:
            while queued:
                if self._fd is None:
                    queued.clear()
                    return
                lines: list[str] = []
                step = self._pending_step
                while queued and len(lines) < 256:
                    values = queued.popleft()
                    lines.append(step_line(values))
                    step = values[0]
                self._add_locked(("\n".join(lines) + "\n").encode("utf-8"))
                self._pending_step = step
            if time.monotonic() - self._last_flush >= self.flush_interval_s:
                self._flush_locked()

    def _add_locked(self, data: bytes) -> None:
        n = len(data)
        if self._used + n > len(self._buf):
            self._flush_locked()  # full: what waits goes first
        if n > len(self._buf):
            self._write_all(memoryview(data))  # rows bigger than the buffer: on their own
        else:
            self._view[self._used:self._used + n] = data
            self._used += n

    def flush(self, older_than_s: float = 0.0) -> None:
        """Write what waits now, or only when the last flush is ``older_than_s`` ago (the
        background flusher's test); close() and RunRecorder.flush call it."""
        if self._queued:
            try:
                self.encode_queued()
            except OSError as exc:  # the disk failed: the step path's next write reports it
                self._deferred = exc
        with self._lock:
            if self._used and time.monotonic() - self._last_flush >= older_than_s:
                try:
                    self._flush_locked()
                except OSError as exc:  # the disk failed: the step path's next write reports it
                    self._deferred = exc

    def _flush_locked(self) -> None:
        self._last_flush = time.monotonic()
        if not self._used or self._fd is None:
            return
        used, self._used = self._used, 0
        self._write_all(self._view[:used])  # OSError (disk full) goes to the caller
        self.flushes += 1
        self.flushed_step = self._pending_step

    def _write_all(self, data: memoryview) -> None:
        assert self._fd is not None
        while data:
            written = os.write(self._fd, data)
            data = data[written:]

    def close(self) -> None:
        _FLUSHER.discard(self)
        with contextlib.suppress(OSError):
            self.encode_queued()
        with self._lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    self._flush_locked()
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None
            self._used = 0


class _Flusher:
    """One daemon thread for every open writer: flushes the rows of a writer whose last flush
    is two intervals old (its loop stopped publishing: a long step, a hang), and at interpreter
    exit what is left."""

    def __init__(self) -> None:
        self._writers: weakref.WeakSet[MetricsWriter] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._wake = threading.Event()  # a writer with a shorter interval came: sleep less
        self._thread: threading.Thread | None = None

    def add(self, writer: MetricsWriter) -> None:
        with self._lock:
            self._writers.add(writer)
            self._wake.set()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="memtop-flush",
                                                daemon=True)
                self._thread.start()

    def discard(self, writer: MetricsWriter) -> None:
        """The writer is closed. The last one's close also ends the thread (joined, ≤ 1 s):
        a thread left waiting at interpreter exit made a DDP rank abort in torch's teardown
        ("terminate called without an active exception", 1 exit in ~7 under torchrun+gloo;
        tests/integration/test_ranks_split.py); a later writer starts a new one."""
        with self._lock:
            self._writers.discard(writer)
            thread = self._thread if not self._writers else None
            self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)

    def _run(self) -> None:
        last_stall_check = time.monotonic()
        while True:
            with self._lock:
                writers = list(self._writers)
                if not writers:  # every writer closed (or collected): end; add() starts anew
                    self._thread = None
                    return
            interval = min((w.flush_interval_s for w in writers), default=FLUSH_INTERVAL_S)
            if self._wake.wait(min(ENCODE_EVERY_S, interval / 2)):
                self._wake.clear()
            for writer in writers:
                if not writer.queued_rows:
                    continue
                try:
                    writer.encode_queued()
                except OSError as exc:  # the step path's next write reports it
                    writer._deferred = exc
                except Exception:  # noqa: BLE001 - a failing writer must not end the thread
                    pass
            if time.monotonic() - last_stall_check >= interval / 2:
                last_stall_check = time.monotonic()
                self.flush_all(writers, stalled_only=True)

    def flush_all(self, writers: list[MetricsWriter] | None = None,
                  stalled_only: bool = False) -> None:
        if writers is None:
            with self._lock:
                writers = list(self._writers)
        for writer in writers:
            with contextlib.suppress(Exception):  # a failing file: MetricsWriter.flush keeps it
                writer.flush(2 * writer.flush_interval_s if stalled_only else 0.0)


_FLUSHER = _Flusher()
atexit.register(_FLUSHER.flush_all)
