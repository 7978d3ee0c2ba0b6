"""metrics.jsonl written: one JSON object a line, appended; step rows batched and flushed by time.

A step row costs the step path one list append: a StepSample is frozen, so it is encoded later,
with the other pending rows, by whichever thread flushes. The flush (encoding, one ``write`` and
one ``flush`` system call) is the job of a background thread every ``flush_interval_s``; on a GPU
loop it runs while the training thread waits for the device (torch releases the GIL there), and
on a CPU-bound loop it costs the same GIL time as before, but for a batch with warm caches. The
step path flushes itself only when the background thread is late by a whole interval (starved).
An event is encoded at once (its data is a mutable dict) and flushed at once, with every row
before it: events are rare and are what live readers wait for (profile_started, paused, a leak
alert, run_finished). The one periodic kind, the ledger's measurement (every 50 steps), waits for
the next flush instead. The order of the file is the order of publishing.

What can be lost: nothing on a normal exit, an exception, or an interpreter exit without
close() (close() flushes; an atexit hook flushes every writer still open). A process killed
with SIGKILL (or by the OOM killer) loses the step rows published since the last flush: at most
``flush_interval_s`` of rows (twice that while the flusher thread is starved of the GIL); see
RESULTS.md, issue 28, and the real ``kill -9`` in tests/unit/test_metrics_writer.py. Every line
on disk is complete but possibly the last one, which readers skip as a truncated line.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from probes import records as R
from probes.records import Record, StepSample
from probes.runfolder.atomic import json_safe

FLUSH_INTERVAL_S = 0.5  # the most of step rows a SIGKILL can take with it
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

    Rows wait in memory for about ``flush_interval_s`` (0: every row is encoded and flushed
    at once, as before issue 28); events but BATCHED_EVENTS flush at once. The module docstring says
    what a kill loses. ``flushes`` counts the file writes, ``flushed_step`` is the last step on
    disk.
    """

    def __init__(self, path: Path, flush_interval_s: float = FLUSH_INTERVAL_S) -> None:
        if not flush_interval_s >= 0:
            raise ValueError(f"flush_interval_s must be zero or positive, got {flush_interval_s}")
        self.path = Path(path)
        self.flush_interval_s = flush_interval_s
        self._fh = open(self.path, "a", encoding="utf-8")
        self._lock = threading.Lock()
        self._pending: list[str | StepSample] = []  # encoded lines, or rows to encode
        self._pending_step = 0  # the step of the last row pending
        self._last_flush = time.monotonic()
        self._deferred: OSError | None = None  # the background flush failed: the next write says
        self.flushes = 0  # file writes so far (each one write + flush of the pending lines)
        self.flushed_step = 0  # the step of the last row on disk
        if flush_interval_s > 0:
            _FLUSHER.add(self)

    def write_row(self, row: dict[str, Any], urgent: bool = True) -> None:
        """One row, encoded now; ``urgent`` rows (events) reach the file before this returns."""
        self._add(json_line(row), row.get("step", self._pending_step), urgent)

    def write(self, record: Record) -> None:
        if type(record) is StepSample:
            if self.flush_interval_s > 0:
                self._add(record, record.step, False)  # frozen: encoded at the flush
            else:
                self.write_row(record.to_json())
        else:
            self.write_row(record.to_json(),
                           urgent=getattr(record, "event", None) not in BATCHED_EVENTS)

    def _add(self, item: str | StepSample, step: int, urgent: bool) -> None:
        with self._lock:
            if self._deferred is not None:
                raise self._deferred
            self._pending.append(item)
            self._pending_step = step
            # the background thread flushes every interval; the step path only when it is late
            if urgent or time.monotonic() - self._last_flush >= 2 * self.flush_interval_s:
                self._flush_locked()

    def flush(self) -> None:
        """Write what is pending now (the background flusher and close() call it)."""
        with self._lock:
            if self._pending:
                try:
                    self._flush_locked()
                except OSError as exc:  # the disk failed: the step path's next write reports it
                    self._deferred = exc

    def _flush_locked(self) -> None:
        items, self._pending = self._pending, []
        self._last_flush = time.monotonic()
        if self._fh.closed:
            return
        lines = [x if type(x) is str else json_line(x.to_json()) for x in items]
        self._fh.write("\n".join(lines) + "\n")  # OSError (disk full) goes to the caller
        self._fh.flush()
        self.flushes += 1
        self.flushed_step = self._pending_step

    def close(self) -> None:
        _FLUSHER.discard(self)
        with self._lock:
            if not self._fh.closed:
                with contextlib.suppress(OSError, ValueError):
                    if self._pending:
                        self._flush_locked()
                with contextlib.suppress(OSError):
                    self._fh.close()
            self._pending = []


class _Flusher:
    """One daemon thread for every open writer: flushes pending step rows each interval, so a
    row is on disk at most ``flush_interval_s`` after it was written even when the loop stops
    writing (a long step, a hang), and at interpreter exit flushes what is left."""

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
            if self._wake.wait(interval):
                self._wake.clear()
            self.flush_all(writers)

    def flush_all(self, writers: list[MetricsWriter] | None = None) -> None:
        if writers is None:
            with self._lock:
                writers = list(self._writers)
        for writer in writers:
            with contextlib.suppress(Exception):  # a failing file: MetricsWriter.flush keeps it
                writer.flush()


_FLUSHER = _Flusher()
atexit.register(_FLUSHER.flush_all)
