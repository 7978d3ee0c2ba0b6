"""What the dashboard reads: a run's records in order, and a way to send it requests.

Two sources, one app. ``TrainerSource`` is memtop's own trainer on a thread of this process
(`memtop train`, tui/trainer_source.py): records arrive through a ring, requests go straight to
its control object. ``FolderSource`` (here) is a run folder on disk (`memtop view`): written live
by another process (followed as it grows, requests through the run's socket) or finished;
``LaunchSource`` is the folder of the ranks this process launched. The app never sees the
Trainer itself. docs/ARCHITECTURE.md draws the picture.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from probes.control import agree_step
from probes.control.requests import REQUESTS
from probes.control.unix_socket import NotLive
from probes.control.unix_socket import request as send_request
from probes.records import Record, StepSample, record_from_json
from probes.runfolder import (
    Follower,
    check_run_folder,
    metrics_files,
    read_config,
    read_history,
    socket_name,
)

LIVE_CHECK_S = 2.0  # a followed run that wrote nothing this long is pinged (has it died?)


class RunSource:
    """The interface the app reads. ``poll`` is called on the UI thread a few times a second
    and must be cheap; ``request`` may block (a socket round trip): call it off the loop."""

    run_dir: Path
    config: dict[str, Any]
    in_process = False  # the run lives and dies with this process (q stops it)

    def start(self) -> None:
        """Begin: start the trainer, or open the files."""

    def poll(self) -> list[Record]:
        raise NotImplementedError

    def history(self) -> tuple[list[Record], list[StepSample]]:
        """What happened before the app opened: (records in order, a thinned step series over
        the whole run for the chart)."""
        return [], []

    def request(self, kind: str, at_step: int | None = None, reason: str | None = None) \
            -> str | None:
        """Ask the run to do ``kind`` (probes.control.REQUESTS); None when sent, else why not."""
        raise NotImplementedError

    @property
    def live(self) -> bool:
        """Records may still come and requests may be acted on."""
        return False

    @property
    def note(self) -> str | None:
        """Something the status line should say about the source itself."""
        return None

    def liveness_due(self) -> bool:
        """Whether the app should ``ping`` the run now (off the loop): only a followed run that
        has gone quiet, whose process may have died without its last row."""
        return False

    def ping(self) -> dict[str, Any] | None:
        """The run's answer to a ping, or None when it is not live."""
        return None

    def close(self) -> None:
        """Stop reading (the run itself is not touched)."""


class FolderSource(RunSource):
    """A run folder on disk, followed as long as another process writes it."""

    def __init__(self, run_dir: str | os.PathLike[str], keep_last: int = 512,
                 chart_points: int = 512, expected_ranks: int | None = None) -> None:
        self.run_dir = check_run_folder(run_dir)
        self.config = read_config(self.run_dir)
        nproc = self.config.get("nproc")
        # ranks whose files may still appear (they start at different times)
        self.expected_ranks = expected_ranks or (nproc if isinstance(nproc, int) else 1)
        self.keep_last, self.chart_points = keep_last, chart_points
        self.followers: dict[int | None, Follower] = {}
        self.bad = 0
        self._history_bad = 0
        self.not_live: str | None = None  # why requests cannot be sent, once known
        self._finished_ranks: set[int | None] = set()
        self.step_ms: float | None = None  # the last step's time (how far ahead to agree)
        self._history: tuple[list[Record], list[StepSample]] = ([], [])
        self._rows_at = self._pinged_at = time.monotonic()  # the last rows read / ping asked

    def start(self) -> None:
        if self.followers:
            return  # already read (for_folder reads it to learn the device; on_mount again)
        records: list[Record] = []
        chart: list[StepSample] = []
        for rank, path in metrics_files(self.run_dir).items():
            hist = read_history(path, self.keep_last, self.chart_points)
            self._history_bad += hist.bad
            mine = _records(hist.rows)
            if any(getattr(r, "event", None) == "run_finished" for r in mine):
                self._finished_ranks.add(rank)
            records += mine
            chart += [r for r in _records(hist.chart_steps) if isinstance(r, StepSample)]
            self.followers[rank] = Follower(path, offset=hist.end)
        if len(self.followers) > 1:  # several ranks: order by the run's clock
            records.sort(key=lambda r: r.time_s)
            chart.sort(key=lambda r: (r.step, r.rank))
        self._history = (records, chart)

    def history(self) -> tuple[list[Record], list[StepSample]]:
        return self._history

    def poll(self) -> list[Record]:
        if len(self.followers) < self.expected_ranks or not self.followers:
            # the run (or some of its ranks) had not written its metrics yet when we opened
            for rank, path in metrics_files(self.run_dir).items():
                if rank not in self.followers:
                    self.followers[rank] = Follower(path)
        out: list[Record] = []
        self.bad = self._history_bad + sum(f.bad for f in self.followers.values())
        for rank, follower in self.followers.items():
            rows = follower.poll()
            if rows:  # it writes, so it lives, whatever a ping said before
                self._rows_at, self.not_live = time.monotonic(), None
            for r in _records(rows):
                out.append(r)
                if isinstance(r, StepSample):
                    self.step_ms = r.step_ms
                elif getattr(r, "event", None) == "run_started":
                    world = r.data.get("world_size")  # ranks of other nodes may come later
                    if isinstance(world, int) and world > self.expected_ranks:
                        self.expected_ranks = world
                if getattr(r, "event", None) == "run_finished":
                    self._finished_ranks.add(rank)
        return out

    @property
    def finished(self) -> bool:
        return (bool(self.followers) and len(self.followers) >= self.expected_ranks
                and set(self.followers) <= self._finished_ranks)

    @property
    def gone(self) -> bool:
        return any(f.gone for f in self.followers.values())

    @property
    def live(self) -> bool:
        return not self.finished and not self.gone and self.not_live is None

    @property
    def note(self) -> str | None:
        parts = []
        if self.gone:
            parts.append("metrics file deleted: showing the last state")
        cut = sum(f.truncations for f in self.followers.values())
        if cut:
            parts.append("metrics file cut back in place (copytruncate?): reading on from its "
                         "new start" + (f" ({cut}×)" if cut > 1 else ""))
        if self.bad:
            parts.append(f"{self.bad} bad lines skipped")
        if self.not_live and not self.finished:
            parts.append(f"not live ({self.not_live})")
        return "; ".join(parts) or None

    def sockets(self) -> list[Path]:
        # a copy: the ping's thread reads it while poll() may add a rank's follower
        return [self.run_dir / socket_name(rank) for rank in list(self.followers) or [None]]

    def request(self, kind: str, at_step: int | None = None, reason: str | None = None) \
            -> str | None:
        """Send to every rank's socket (the same ``at_step`` for all); blocks up to ~3 s."""
        if kind not in REQUESTS:
            return f"unknown request {kind!r}"
        if self.finished:
            return "the run has finished"
        sockets = self.sockets()
        if len(sockets) > 1 and at_step is None and kind != "resume":
            # several ranks: all act before the same future step (a rank that stops or pauses
            # a step early leaves the others waiting in the gradient all-reduce)
            at_step, why_not = agree_step(self.run_dir, list(self.followers), self.step_ms)
            if why_not is not None:
                return f"not live: {why_not}"
        payload: dict[str, Any] = {"request": kind, "source": f"viewer pid {os.getpid()}"}
        if at_step is not None:
            payload["at_step"] = at_step
        if reason:
            payload["reason"] = reason
        errors = []
        for path in sockets:
            try:
                answer = send_request(path, payload)
            except NotLive as exc:
                self.not_live = exc.strerror or str(exc)
                return f"not live: {self.not_live}"
            if not answer.get("ok"):
                errors.append(str(answer.get("error")))
        return "; ".join(errors) or None

    def liveness_due(self) -> bool:
        """Nothing written for LIVE_CHECK_S and no ping for as long: a killed run leaves no
        run_finished, so only its socket's silence tells (``ping`` then sets ``not_live``;
        a paused or slow run answers and stays live)."""
        now = time.monotonic()
        if self.finished or min(now - self._rows_at, now - self._pinged_at) < LIVE_CHECK_S:
            return False
        self._pinged_at = now
        return True

    def ping(self) -> dict[str, Any] | None:
        """The run's answer to ping (rank 0's), or None when it is not live."""
        try:
            answer = send_request(self.sockets()[0], {"request": "ping"}, timeout_s=1.0)
        except NotLive as exc:
            self.not_live = exc.strerror or str(exc)
            return None
        self.not_live = None
        return answer

    def close(self) -> None:
        for f in self.followers.values():
            f.close()


class LaunchSource(FolderSource):
    """The folder of ranks this process launched (`memtop train --nproc N`): followed like a
    viewer's, live while torchrun runs; once it has ended, ``failure`` says which rank failed
    and why (probes/analysis/ranks.py)."""

    def __init__(self, launch: Any) -> None:
        super().__init__(launch.run_dir, expected_ranks=launch.nproc)
        self.launch = launch
        self.failure: str | None = None  # which rank failed and why, once torchrun has ended
        self.failure_rank: int | None = None
        self._ended = False
        self.start()

    @property
    def device_type(self) -> str:
        started = next((r for r in self._history[0] if getattr(r, "event", None)
                        == "run_started"), None)
        device = str(started.data.get("device", "")) if started is not None else ""
        want = str(self.config.get("device") or "")
        return "cuda" if device.startswith("cuda") or want.startswith("cuda") else "cpu"

    def start(self) -> None:
        if not self.followers:
            super().start()

    def poll(self) -> list[Record]:
        out = super().poll()
        if not self._ended and not self.launch.running:
            self._ended = True
            out += super().poll()  # what the ranks wrote last
            from probes.analysis.ranks import (
                failed_rank,
                failure_text,
                rank_ends,
                read_process_exits,
            )

            ends, exits = rank_ends(self.run_dir), read_process_exits(self.run_dir)
            self.failure = failure_text(ends, exits)
            culprit = failed_rank(ends, exits)
            self.failure_rank = culprit.rank if culprit is not None else None
        return out

    @property
    def live(self) -> bool:
        return self.launch.running and not self.finished

    @property
    def note(self) -> str | None:
        base = super().note
        if not self.launch.running:
            code = self.launch.poll()
            return "; ".join(x for x in (base, f"torchrun ended ({code})") if x)
        return base


def _records(rows: list[dict[str, Any]]) -> list[Record]:
    out = []
    for row in rows:
        with contextlib.suppress(ValueError):
            out.append(record_from_json(row))
    return out
