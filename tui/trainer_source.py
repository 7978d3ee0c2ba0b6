"""The run on a thread of this process (`memtop train`, `memtop infer`): the dashboard's
in-process source. Records arrive through a ring the trainer's sinks push to; requests go
straight to its control object, no socket. The interface it offers is tui/sources.py's
RunSource; a run folder another process writes is tui/sources.py's FolderSource.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from probes import records as R
from probes.control.requests import Request, RunControl
from probes.records import Event, Record
from probes.runfolder.state import RunState
from probes.tools.ring import Ring
from trainer.background import BackgroundRun
from tui.sources import RunSource


class EventWake:
    """A sink beside the ring: an event a user waits for (a memory attribution window's table)
    asks the dashboard for a refresh at once instead of at its next 2 Hz tick. One
    ``call_soon_threadsafe`` (tui/app_actions.py ``_on_loop``): it never waits for the UI."""

    kinds = frozenset({R.MEMORY_ATTRIBUTION, R.INFER_ATTRIBUTION})

    def __init__(self) -> None:
        self.callback: Any = None  # set by the app once mounted

    def __call__(self, record: Record) -> None:
        callback = self.callback
        if callback is not None and isinstance(record, Event) and record.event in self.kinds:
            callback()


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
        self.wake: EventWake | None = None  # set by MemtopApp.for_run

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
        error = getattr(self.trainer, "build_error", None)
        if error:
            return f"the trainer could not start: {error}"
        return f"{self.ring.dropped} records dropped" if self.ring.dropped else None


class DeferredTrainer(BackgroundRun):
    """`memtop train`'s trainer, built on its own thread: torch is imported there, after the
    dashboard's frame (header, empty panes, "starting") is on screen (benchmarks/RESULTS.md).

    Offers what TrainerSource and RunEnd read of a Trainer (trainer/loop.py) from the start:
    control, run_dir, config, start/join/alive, exit_code, status, elapsed_s.
    """

    thread_name = "memtop-trainer"

    def _thread_main(self) -> object:
        return self._build_and_run()

    def __init__(self, config: Any, run_dir: Path, sinks: list[Any]) -> None:
        self.config = config
        self.run_dir = Path(run_dir)
        self.control = RunControl()
        self.sinks = sinks
        self.real: Any = None  # the Trainer, once built
        self.build_error: str | None = None
        self._exit_code: int | None = None
        self._thread: threading.Thread | None = None

    def _build_and_run(self) -> None:
        try:
            from probes.monitor import default_hooks
            from trainer.loop import Trainer

            self.real = Trainer(self.config, self.run_dir, control=self.control,
                                sinks=self.sinks, hooks=default_hooks(**self.config.hook_options()))
        except Exception as exc:  # an import or set-up failure: the app shows the error
            self.build_error = f"{type(exc).__name__}: {exc}"
            self._exit_code = 1
            return
        self.real.run()

    def abandon(self, reason: str) -> bool:
        """As Trainer.abandon (seal metrics.jsonl, kill the analysis child); before the trainer
        is built there is no file to seal, and the stop request keeps it from starting."""
        if self.real is not None:
            return bool(self.real.abandon(reason))
        self.control.stop(reason)
        return True

    @property
    def exit_code(self) -> int | None:
        return self.real.exit_code if self.real is not None else self._exit_code

    @property
    def status(self) -> RunState:
        return self.real.status if self.real is not None else RunState()

    def elapsed_s(self) -> float:
        return self.real.elapsed_s() if self.real is not None else 0.0
