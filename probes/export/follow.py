"""A run folder followed for the exporter: each rank's metrics file tailed with the run folder's
own Follower, its records folded into the one RunState, and the run's state word said by the
run-outcome rule of `memtop runs` (probes/analysis/runlist.py: no run_finished and nobody
answering the socket is an interrupted run). Nothing here writes to the folder.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from probes.analysis.runlist import run_outcome, socket_answers
from probes.export.names import OUTCOME_STATE
from probes.export.series import RankSeries, rank_series
from probes.records import record_from_json
from probes.runfolder import Follower, metrics_files, read_config, read_history
from probes.runfolder.state import RunState

# a file up to this size is read whole when first seen (its unreadable lines all counted); a
# longer one opens as the viewer does (events and the last step: read_history), and its
# unreadable lines are counted from there on
FULL_READ_BYTES = 16 << 20
PING_EVERY_S = 2.0  # a live run's socket is asked at most this often (not at every scrape)


class RankFile:
    """One rank's metrics file, tailed, and the fold of what it held."""

    def __init__(self, path: Path, rank: int | None) -> None:
        self.path = Path(path)
        self.rank = rank
        self.state = RunState()
        self.bad_before = 0  # unreadable lines read_history saw when the file was opened
        self._answered: tuple[float, bool] | None = None  # (when, the ping's answer)
        self.mtime = 0.0  # when the file last changed, as last seen (seconds since the epoch)
        size = os.stat(self.path).st_size  # OSError: gone already (the caller skips it)
        if size <= FULL_READ_BYTES:
            self.follower = Follower(self.path)
        else:
            hist = read_history(self.path, keep_last=1, chart_points=0)
            self.bad_before = hist.bad
            self._apply(hist.rows)
            self.follower = Follower(self.path, offset=hist.end)
        self.poll()

    def poll(self) -> int:
        """Fold the rows appended since the last poll; how many there were."""
        rows = self.follower.poll()
        self._apply(rows)
        with contextlib.suppress(OSError):  # gone: the last time seen stays
            self.mtime = os.stat(self.path).st_mtime
        return len(rows)

    def _apply(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            with contextlib.suppress(ValueError):  # the follower has checked step rows
                self.state.apply(record_from_json(row))

    @property
    def unreadable(self) -> int:
        return self.bad_before + self.follower.bad

    @property
    def host(self) -> str | None:
        started = self.state.started or {}
        return started.get("host") if isinstance(started.get("host"), str) else None

    def state_word(self, run_dir: Path, now: float) -> str | None:
        """names.STATES' word for this rank, None before its first row. A rank without
        run_finished is asked whether it is alive at most every PING_EVERY_S."""
        state = self.state
        if not state.records:
            return None
        answered = None
        if not state.finished and state.state != "failed":
            if self._answered is None or now - self._answered[0] >= PING_EVERY_S:
                self._answered = (now, socket_answers(run_dir, self.rank))
            answered = self._answered[1]
        outcome = run_outcome(state, run_dir, self.rank, answered=answered)
        return OUTCOME_STATE.get(outcome, "running")

    def close(self) -> None:
        self.follower.close()


class FollowedRun:
    """Every rank of one run folder; ``refresh()`` reads what was appended, ``series()`` says
    what to export."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.name = self.run_dir.name
        self.ranks: dict[int | None, RankFile] = {}
        self.config: dict[str, Any] = {}
        self.refresh()

    def refresh(self) -> None:
        if not self.config:
            self.config = read_config(self.run_dir)  # {} until rank 0 writes it
        for rank, path in metrics_files(self.run_dir).items():
            if rank not in self.ranks:
                with contextlib.suppress(OSError):  # deleted between the listing and here
                    self.ranks[rank] = RankFile(path, rank)
        for rank_file in self.ranks.values():
            rank_file.poll()

    @property
    def gone(self) -> bool:
        return not self.run_dir.is_dir()

    def last_write(self) -> float:
        """When a metrics file of the run last changed, as last seen (seconds since the
        epoch; a file deleted since keeps its time); 0 if none."""
        return max([0.0, *(rank_file.mtime for rank_file in self.ranks.values())])

    def series(self, host: str, host_label: str | None = None, only_host: str | None = None,
               now: float | None = None) -> list[RankSeries]:
        """One RankSeries per rank with rows. ``host``: the label of a rank whose run_started
        does not say its host (older runs); ``host_label`` replaces every rank's; ranks whose
        run_started names a host other than ``only_host`` are left out (a node's endpoint
        serves its own ranks from a folder that every node writes into)."""
        now = time.monotonic() if now is None else now
        out = []
        for rank_file in self.ranks.values():
            if only_host is not None and rank_file.host not in (None, only_host):
                continue
            word = rank_file.state_word(self.run_dir, now)
            if word is None:
                continue
            out.append(rank_series(self.name, rank_file.rank, host_label or rank_file.host or
                                   host, rank_file.state, word, self.config,
                                   rank_file.unreadable))
        return out

    def ended(self, now: float | None = None) -> bool:
        """Every rank that wrote rows is finished, interrupted or failed."""
        now = time.monotonic() if now is None else now
        words = [r.state_word(self.run_dir, now) for r in self.ranks.values()]
        return any(words) and all(w in (None, "finished", "interrupted", "failed")
                                  for w in words)

    def close(self) -> None:
        for rank_file in self.ranks.values():
            rank_file.close()
