"""What the dashboard reads: a run's records in order, and a way to send it requests.

Two sources, one app. ``TrainerSource`` is memtop's own trainer on a thread of this process
(`memtop train`): records arrive through a ring, requests go straight to its control object.
``FolderSource`` is a run folder on disk (`memtop view`): written live by another process
(followed as it grows, requests through the run's socket) or finished. The app never sees the
Trainer itself. docs/ARCHITECTURE.md draws the picture.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from probes.control import REQUESTS, Request, RunControl
from probes.control_socket import NotLive
from probes.control_socket import request as send_request
from probes.records import Record, StepSample, record_from_json
from probes.ring import Ring
from probes.runfolder import (
    Follower,
    check_run_folder,
    metrics_files,
    read_config,
    read_history,
    socket_name,
)


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

    def close(self) -> None:
        """Stop reading (the run itself is not touched)."""


class TrainerSource(RunSource):
    """memtop's trainer on a thread of this process."""

    in_process = True

    def __init__(self, trainer: Any, ring: Ring[Record]) -> None:
        self.trainer = trainer
        self.ring = ring
        self.run_dir = Path(trainer.run_dir)
        self.config = trainer.config.to_json()
        self.control: RunControl = trainer.control
        self.autostart = True

    def start(self) -> None:
        if self.autostart:
            self.trainer.start()  # the model is built on the trainer thread

    def poll(self) -> list[Record]:
        return self.ring.drain()

    def request(self, kind: str, at_step: int | None = None, reason: str | None = None) \
            -> str | None:
        if kind == "pause":
            self.control.pause()  # acted on at the next boundary, without a queue
        elif kind == "resume":
            self.control.resume()
        elif kind == "stop":
            self.control.stop(reason or "stopped by user")
        else:
            self.control.submit(Request(kind, at_step, "keyboard", reason))
        return None

    @property
    def live(self) -> bool:
        return self.trainer.alive or self.trainer.exit_code is None

    @property
    def note(self) -> str | None:
        return f"{self.ring.dropped} records dropped" if self.ring.dropped else None


class FolderSource(RunSource):
    """A run folder on disk, followed as long as another process writes it."""

    def __init__(self, run_dir: str | os.PathLike[str], keep_last: int = 512,
                 chart_points: int = 2048) -> None:
        self.run_dir = check_run_folder(run_dir)
        self.config = read_config(self.run_dir)
        self.keep_last, self.chart_points = keep_last, chart_points
        self.followers: dict[int | None, Follower] = {}
        self.bad = 0
        self._history_bad = 0
        self.not_live: str | None = None  # why requests cannot be sent, once known
        self._finished_ranks: set[int | None] = set()
        self._history: tuple[list[Record], list[StepSample]] = ([], [])

    def start(self) -> None:
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
        if not self.followers:  # the run had not written its metrics yet when we opened
            for rank, path in metrics_files(self.run_dir).items():
                self.followers[rank] = Follower(path)
        out: list[Record] = []
        self.bad = self._history_bad + sum(f.bad for f in self.followers.values())
        for rank, follower in self.followers.items():
            rows = follower.poll()
            for r in _records(rows):
                out.append(r)
                if getattr(r, "event", None) == "run_finished":
                    self._finished_ranks.add(rank)
        return out

    @property
    def finished(self) -> bool:
        return bool(self.followers) and set(self.followers) <= self._finished_ranks

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
        if self.bad:
            parts.append(f"{self.bad} unreadable lines skipped")
        if self.not_live and not self.finished:
            parts.append(f"not live ({self.not_live})")
        return "; ".join(parts) or None

    def sockets(self) -> list[Path]:
        return [self.run_dir / socket_name(rank) for rank in self.followers or {None: None}]

    def request(self, kind: str, at_step: int | None = None, reason: str | None = None) \
            -> str | None:
        """Send to every rank's socket (the same ``at_step`` for all); blocks up to ~3 s."""
        if kind not in REQUESTS:
            return f"unknown request {kind!r}"
        if self.finished:
            return "the run has finished"
        payload: dict[str, Any] = {"request": kind, "source": f"viewer pid {os.getpid()}"}
        if at_step is not None:
            payload["at_step"] = at_step
        if reason:
            payload["reason"] = reason
        errors = []
        for path in self.sockets():
            try:
                answer = send_request(path, payload)
            except NotLive as exc:
                self.not_live = exc.strerror or str(exc)
                return f"not live: {self.not_live}"
            if not answer.get("ok"):
                errors.append(str(answer.get("error")))
        return "; ".join(errors) or None

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


def _records(rows: list[dict[str, Any]]) -> list[Record]:
    out = []
    for row in rows:
        with contextlib.suppress(ValueError):
            out.append(record_from_json(row))
    return out
