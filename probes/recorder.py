"""Where a run's records go: its metrics file, and the in-process sinks (a dashboard's ring,
headless output). Any thread may publish; a failing sink is dropped, a failing disk stops the
run cleanly (every row already written stays valid).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from probes import records as R
from probes.records import Event, Record
from probes.runfolder import CONFIG, MetricsWriter, metrics_name, write_json
from probes.runstate import RunState

Sink = Callable[[Record], None]


class RunRecorder:
    """Writes one process's records into the run folder and passes them on to sinks.

    ``state`` is the run's state folded from everything published (probes/runstate.py).
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
        if config is not None and not rank:  # rank 0 (or a lone process) writes the config
            write_json(self.run_dir / CONFIG, config)
        self.metrics_path = self.run_dir / metrics_name(rank)
        self._writer: MetricsWriter | None = MetricsWriter(self.metrics_path)

    def elapsed_s(self) -> float:
        return time.perf_counter() - self._t0

    def emit(self, name: str, step: int, data: dict[str, Any] | None = None) -> Event:
        event = Event(name, step, self.elapsed_s(), dict(data or {}), self.rank or 0)
        self.publish(event)
        return event

    def publish(self, record: Record) -> None:
        writer = self._writer
        if writer is not None:
            try:
                writer.write(record)
            except OSError as exc:  # disk full, file system gone: stop cleanly
                self._failed(exc, record)
        self.state.apply(record)
        self._to_sinks(record)

    def _to_sinks(self, record: Record) -> None:
        """A sink that fails (a closed pipe, a UI bug) is dropped; it never stops the run."""
        for sink in list(self.sinks):
            try:
                sink(record)
            except Exception as exc:
                self.sinks.remove(sink)
                self.sink_errors.append(f"{type(exc).__name__}: {exc}")

    def _failed(self, exc: OSError, record: Record) -> None:
        writer, self._writer = self._writer, None  # stop writing; earlier rows are complete
        if writer is not None:
            writer.close()
        self.write_failed = True
        reason = (f"cannot write {self.metrics_path}: {exc.strerror or exc}; training stopped, "
                  f"rows up to step {max(0, record.step - 1)} are saved")
        self._to_sinks(Event(R.METRICS_WRITE_FAILED, record.step, self.elapsed_s(),
                             {"reason": reason}, self.rank or 0))
        if self.on_write_failed is not None:
            self.on_write_failed(reason)

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
