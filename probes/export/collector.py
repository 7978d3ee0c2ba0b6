"""The two sources of an endpoint's metrics, each a prometheus_client collector whose
``collect()`` runs on the HTTP server's thread at scrape time, never on a training step's path:

- ``FolderCollector``: every run under the folders given, followed through their run folders
  (the one interface: any writer is exported without changing it). New run folders are found
  within SCAN_EVERY_S; a run that ended (finished, interrupted, failed) keeps its last values
  for ``keep_s`` after its files last changed, then its series are dropped; a folder deleted
  under it drops its series at the next scan.
- ``RecorderCollector``: one process's own run, from the RunState its recorder already folds
  (probes/runfolder/recorder.py): no file is read, nothing is added to the step.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import Metric

from probes.analysis.runlist import socket_answers
from probes.export.follow import FollowedRun
from probes.export.names import OUTCOME_STATE
from probes.export.series import RankSeries, families, rank_series
from probes.runfolder import find_runs, is_run_folder, metrics_files, read_config
from probes.runfolder.recorder import RunRecorder

SCAN_EVERY_S = 1.0  # new run folders appear in the scrapes within this
POLL_EVERY_S = 0.05  # files are read at most this often, however often Prometheus scrapes
DEFAULT_KEEP_S = 300.0  # an ended run's last values stay this long after its last write


class FolderCollector:
    """Every run under ``roots`` (each a run folder or a folder of runs, as `memtop runs`
    reads them). ``host_label`` names the host of every series (default: the host each run's
    run_started recorded, else this machine's name); ``only_host`` leaves out the ranks that
    ran elsewhere. Safe to call from several scrapes at once."""

    def __init__(self, roots: Iterable[str | os.PathLike[str]], keep_s: float = DEFAULT_KEEP_S,
                 host_label: str | None = None, only_host: str | None = None) -> None:
        self.roots = [Path(r) for r in roots]
        self.keep_s = keep_s
        self.host_label = host_label
        self.only_host = only_host
        self.host = socket.gethostname()
        self.runs: dict[Path, FollowedRun] = {}
        self.dropped: set[Path] = set()  # ended and kept long enough: never read again
        self._lock = threading.Lock()
        self._scanned = -float("inf")
        self._polled = -float("inf")

    def describe(self) -> list[Metric]:
        return []  # registering must not read the folders

    def collect(self) -> list[Metric]:
        with self._lock:
            now = time.monotonic()
            if now - self._scanned >= SCAN_EVERY_S:
                self._scan()
                self._scanned = now
            if now - self._polled >= POLL_EVERY_S:
                for run in list(self.runs.values()):
                    with contextlib.suppress(OSError):
                        run.refresh()
                self._drop_ended(now)
                self._polled = time.monotonic()
            series: list[RankSeries] = []
            for run in self.runs.values():
                series += run.series(self.host, self.host_label, self.only_host, now)
        return families(series)

    def _scan(self) -> None:
        found: set[Path] = set()
        for root in self.roots:
            if is_run_folder(root):
                found.add(root)
            else:
                found.update(find_runs(root))  # [] for a folder that is gone
        for path in list(self.runs):
            if path not in found:  # deleted under us: its series go at once
                self.runs.pop(path).close()
        for path in sorted(found - set(self.runs) - self.dropped):
            if self._long_ended(path):
                self.dropped.add(path)
                continue
            with contextlib.suppress(OSError):
                self.runs[path] = FollowedRun(path)

    def _long_ended(self, path: Path) -> bool:
        """A run seen for the first time whose files have not changed for keep_s and whose
        sockets do not answer: ended long ago, not read at all (a folder of old runs)."""
        files = metrics_files(path)
        times = []
        for file in files.values():
            with contextlib.suppress(OSError):
                times.append(os.stat(file).st_mtime)
        if not times or time.time() - max(times) < self.keep_s:
            return False
        return not any(socket_answers(path, rank) for rank in files)

    def _drop_ended(self, now: float) -> None:
        wall = time.time()
        for path, run in list(self.runs.items()):
            if run.ended(now) and wall - run.last_write() >= self.keep_s:
                self.runs.pop(path).close()
                self.dropped.add(path)

    def close(self) -> None:
        with self._lock:
            for run in self.runs.values():
                run.close()
            self.runs.clear()


class RecorderCollector:
    """This process's run, as its recorder's RunState holds it (at most the recorder's batch
    interval behind the loop: probes/runfolder/recorder.py publish_soon)."""

    def __init__(self, recorder: RunRecorder, host_label: str | None = None) -> None:
        self.recorder = recorder
        self.host = host_label or socket.gethostname()
        self._config: dict[str, Any] = {}

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> list[Metric]:
        state = self.recorder.state
        if not state.records:
            return families([])
        if not self._config:
            self._config = read_config(self.recorder.run_dir)
        if state.finished or state.state == "failed":
            word = OUTCOME_STATE.get(state.outcome, "finished")
        else:
            word = "paused" if state.state == "paused" else "running"
        return families([rank_series(self.recorder.run_dir.name, self.recorder.rank,
                                     self.host, state, word, self._config)])
