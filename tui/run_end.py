"""How one dashboard run ends, whichever way it goes (q, SIGTERM/SIGHUP, a forced quit, the UI
itself failing): the trainer stopped and joined off the event loop, the report written exactly
once, and a bounded wait that says on the terminal what it is waiting for. No Textual here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from probes.control.requests import RunControl
from tui.finish import finish_run
from tui.output import say

if TYPE_CHECKING:
    from trainer.loop import Trainer


class RunEnd:
    def __init__(self, trainer: Trainer, control: RunControl, run_dir: Path) -> None:
        self.trainer = trainer
        self.control = control
        self.run_dir = run_dir
        self.finished = False  # finish_run done
        self.report_path: Path | None = None
        self.abandoned = False  # the trainer was still busy when the process had to leave
        self._lock = threading.Lock()

    def stop_in_background(self, reason: str, then: Callable[[], None]) -> None:
        """Stop at the next step boundary; join, write the report, then call ``then``.

        A plain daemon thread, not a Textual worker: workers run on the event loop's executor,
        which asyncio.run() joins before app.run() returns, so a forced quit would still wait
        for the step in flight; a daemon thread never holds the process up either.
        """
        self.control.stop(reason)
        threading.Thread(target=self._join_and_finish, args=(then,), name="memtop-quit",
                         daemon=True).start()

    def _join_and_finish(self, then: Callable[[], None]) -> None:
        self.trainer.join()
        self.finish()
        then()

    def finish(self) -> Path | None:
        """Write the report once, whichever of the quit thread and shutdown() comes first."""
        with self._lock:
            if not self.finished:
                self.report_path = finish_run(self.run_dir, None)
                self.finished = True
        return self.report_path

    def exit_code(self) -> int:
        """The trainer's status (trainer/exit_codes.py): 0 finished or stopped on request, 1
        failed, 3 stopped by the memory guard; 0 while it has none (still running)."""
        return self.trainer.exit_code or 0

    def shutdown(self, timeout_s: float, out: TextIO | None = None) -> None:
        """Stop, join for at most ``timeout_s``, then write the report.

        ``out`` hears what a slow exit waits for: after a forced quit, the step in flight (a
        profiler analysis, a slow step on a busy machine) may take seconds. A trainer still
        busy after that is abandoned: run_finished is written for it (trainer.abandon).
        """
        self.control.stop()
        if not self.trainer.join(min(0.5, timeout_s)):
            say(out, f"memtop: waiting up to {timeout_s:g} s for the training thread to end the "
                     f"step in flight (last finished: step {self.trainer.status.step})…")
            self.trainer.join(max(0.0, timeout_s - 0.5))
        if self.trainer.alive:
            say(out, "memtop: the training thread is still busy; ending the run without it "
                     "(metrics.jsonl keeps every finished step)")
            self.abandon("the training thread did not end in time")
        self.finish()

    def abandon(self, reason: str) -> None:
        self.abandoned = True
        self.trainer.abandon(reason)

    def end_now(self, reason: str, budget_s: float) -> None:
        """The process leaves within ``budget_s`` (a signal, a lost terminal): the trainer
        stops without waiting for anything (or is abandoned), then the report, if time allows.
        Safe from any thread, alongside the normal quit path."""
        t_end = time.monotonic() + budget_s
        self.control.stop(reason, urgent=True)
        report_s = min(0.5, budget_s / 2)  # a short run's report takes tens of ms
        self.trainer.join(max(0.0, t_end - report_s - time.monotonic()))
        if self.trainer.alive:
            self.abandon(reason)
        else:
            from probes.traces.worker import kill_workers

            kill_workers()  # a window's idle worker, if the trainer did not reap it
        done = threading.Thread(target=self.finish, name="memtop-report-now", daemon=True)
        done.start()
        done.join(max(0.05, t_end - time.monotonic()))
