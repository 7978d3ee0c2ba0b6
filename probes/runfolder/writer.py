"""metrics.jsonl written: one JSON object a line, appended; step rows batched and flushed by time.

A step row costs the step path its JSON encoding (one C call, the encoder made once) and a copy
into a buffer made once: a row waiting for the flush leaves nothing on the heap, so the CPU's
"allocated" counter (glibc's heap in use, read mid-step and at each step's end) sees no
sawtooth of waiting rows. (Rows kept as Python objects until a flush did move it: pymalloc
arenas of 256 KiB came and went with the batches, and a leak alert's first step moved.) The
flush (one ``os.write``) runs on the publishing thread once ``flush_interval_s`` has passed,
right after a row is added; a background thread stands in only when rows wait twice the
interval (a long step, a hung loop), so the file never lags far behind a run that stopped.
An event is flushed at once, with every row before it: events are rare and are what live
readers wait for (profile_started, paused, a leak alert, run_finished). The one periodic kind,
the ledger's measurement (every 50 steps), waits for the next flush instead. The order of the
file is the order of publishing.

What can be lost: nothing on a normal exit, an exception, or an interpreter exit without
close() (close() flushes; an atexit hook flushes every writer still open). A process killed
with SIGKILL (or by the OOM killer) loses the step rows published since the last flush: at most
``flush_interval_s`` of rows and one step (twice the interval when no step ends meanwhile); see
RESULTS.md, issue 28, and the real ``kill -9`` in tests/unit/test_metrics_writer.py. Every line
on disk is complete but possibly the last one, which readers skip as a truncated line.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from probes import records as R
from probes.records import Record, StepSample
from probes.runfolder.atomic import json_safe

FLUSH_INTERVAL_S = 0.5  # the most of step rows a SIGKILL can take with it
BUFFER_BYTES = 1 << 20  # ~1,500 step rows: a row waits for the interval or for a full buffer
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


class MetricsWriter:
    """Appends one JSON object per line; safe to call from any thread.

    Rows wait in a fixed buffer for about ``flush_interval_s`` (0: every row is written at
    once, as before issue 28); events but BATCHED_EVENTS flush at once. The module docstring
    says what a kill loses. ``flushes`` counts the file writes, ``flushed_step`` is the last
    step on disk.
    """

    def __init__(self, path: Path, flush_interval_s: float = FLUSH_INTERVAL_S,
                 buffer_bytes: int = BUFFER_BYTES) -> None:
        if not flush_interval_s >= 0:
            raise ValueError(f"flush_interval_s must be zero or positive, got {flush_interval_s}")
        self.path = Path(path)
        self.flush_interval_s = flush_interval_s
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
        if flush_interval_s > 0:
            _FLUSHER.add(self)

    def write_row(self, row: dict[str, Any], urgent: bool = True) -> None:
        """One row; ``urgent`` rows (events) reach the file before this returns."""
        data = (json_line(row) + "\n").encode("utf-8")
        step = row.get("step", self._pending_step)
        with self._lock:
            if self._deferred is not None:
                raise self._deferred
            if self._fd is None:
                return
            n = len(data)
            if self._used + n > len(self._buf):
                self._flush_locked()  # full: what waits goes first
            if n > len(self._buf):
                self._write_all(memoryview(data))  # a row bigger than the buffer: on its own
            else:
                self._view[self._used:self._used + n] = data
                self._used += n
            self._pending_step = step
            if urgent or time.monotonic() - self._last_flush >= self.flush_interval_s:
                self._flush_locked()

    def write(self, record: Record) -> None:
        urgent = type(record) is not StepSample and \
            getattr(record, "event", None) not in BATCHED_EVENTS
        self.write_row(record.to_json(), urgent=urgent)

    def flush(self, older_than_s: float = 0.0) -> None:
        """Write what waits now, or only when the last flush is ``older_than_s`` ago (the
        background flusher's test); close() and RunRecorder.flush call it."""
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
        with self._lock:
            self._writers.discard(writer)

    def _run(self) -> None:
        while True:
            with self._lock:
                writers = list(self._writers)
            interval = min((w.flush_interval_s for w in writers), default=FLUSH_INTERVAL_S)
            if self._wake.wait(interval / 2):
                self._wake.clear()
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
