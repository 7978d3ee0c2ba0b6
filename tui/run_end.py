"""How one dashboard run ends, whichever way it goes (q, SIGTERM/SIGHUP, a forced quit, the UI
itself failing): the trainer stopped and joined off the event loop, the report written exactly
once, and a bounded wait that says on the terminal what it is waiting for. No Textual here.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from probes.control import RunControl
from tui.finish import finish_run

if TYPE_CHECKING:
    from trainer.loop import Trainer


def say(out: TextIO | None, text: str) -> None:
    """One line for the user on the restored terminal; silent when it has hung up."""
    if out is not None:
        with contextlib.suppress(OSError, ValueError):
            print(text, file=out, flush=True)


class RunEnd:
    def __init__(self, trainer: Trainer, control: RunControl, run_dir: Path) -> None:
        self.trainer = trainer
        self.control = control
        self.run_dir = run_dir
        self.finished = False  # finish_run done
        self.report_path: Path | None = None
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
        """0 when the run stopped or finished; 1 when the training itself failed."""
        return 1 if self.trainer.exit_code == 1 else 0

    def shutdown(self, timeout_s: float, out: TextIO | None = None) -> None:
        """Stop, join for at most ``timeout_s``, then write the report if the trainer is done.

        ``out`` hears what a slow exit waits for: after a forced quit, the step in flight (a
        profiler analysis, a slow step on a busy machine) may take seconds.
        """
        self.control.stop()
        if not self.trainer.join(min(0.5, timeout_s)):
            say(out, f"memtop: waiting up to {timeout_s:g} s for the training thread to end the "
                     f"step in flight (last finished: step {self.trainer.status.step})…")
            self.trainer.join(timeout_s)
        if self.trainer.alive:
            say(out, "memtop: the training thread is still busy; leaving without the report "
                     f"(metrics.jsonl holds every finished step; `memtop report {self.run_dir}` "
                     "writes it)")
        else:
            self.finish()
