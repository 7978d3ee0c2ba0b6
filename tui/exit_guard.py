"""The backstop that ends `memtop train` when its terminal goes away, whatever the UI is doing.

memtop runs over SSH. When the connection drops (SIGHUP, then EIO on every write to the tty),
or someone sends SIGTERM, the dashboard asks for the same clean quit as `q`. That path runs on
the event loop, which may be unable to run it: Textual's writer thread dies on EIO and the loop
then blocks forever on its full output queue (docs/ARCHITECTURE.md). So a thread of our own,
started before the app, owns the deadline: by ``deadline_s`` after the first signal the process
has ended, normally or by this thread (the run folder sealed and its report written first).
A second SIGTERM/SIGINT cuts the wait to ``hurry_s``. README: "When things go wrong".

Signal handlers here only set flags and events: Python runs them on the main thread between two
bytecodes, possibly while that thread holds a lock the handler would need.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

DEADLINE_S = 2.5  # first signal -> the backstop acts (the clean path takes well under 1 s)
FINAL_S = 1.5  # what the backstop itself may take: join, seal, report
HURRY_S = 0.7  # a second SIGTERM/SIGINT: the whole way out
HURRY_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class ExitGuard:
    """Arms on the first quit signal (or a lost terminal) and ends the process in time.

    ``ask_quit(signum, reason)`` is called once, from this guard's thread, to start the clean
    quit, after ``detach()`` has stopped the UI reading a terminal that is gone (a hung-up tty
    reads as endless EOF: Textual's input thread would spin on it, holding the GIL). If the
    process is still here at the deadline, ``end_now(reason, budget_s)`` finishes
    the run folder (RunEnd.end_now; None for a viewer, which owns no run) and ``restore()``
    puts the terminal back (bounded; skipped when the terminal is gone); then os._exit.
    """

    def __init__(self, ask_quit: Callable[[int, str], None],
                 end_now: Callable[[str, float], None] | None = None,
                 restore: Callable[[], None] | None = None,
                 detach: Callable[[], bool] | None = None, deadline_s: float = DEADLINE_S,
                 final_s: float = FINAL_S, hurry_s: float = HURRY_S) -> None:
        self.ask_quit = ask_quit
        self.end_now = end_now
        self.restore = restore
        self.detach = detach  # stops reading a terminal that is gone; True if it was gone
        self.deadline_s, self.final_s, self.hurry_s = deadline_s, final_s, hurry_s
        self.signum: int | None = None  # the first signal (SIGHUP for a lost terminal)
        self.terminal_lost = False
        self.forced = False  # this guard ended the process
        self._t0: float | None = None
        self._hurried = False
        self._armed = threading.Event()
        self._hurry = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memtop-exit-guard", daemon=True)
        self._thread.start()

    # called from a signal handler or any thread: flags and events only ------------------------
    def on_signal(self, signum: int) -> None:
        if self.signum is None:
            self.signum = signum
            self._t0 = time.monotonic()
            self._armed.set()
        elif signum in HURRY_SIGNALS and not self._hurried:
            self._hurried = True
            self._hurry.set()

    def on_terminal_lost(self) -> None:
        """A write to the terminal failed (EIO, EPIPE): as if SIGHUP came."""
        self.terminal_lost = True
        self.on_signal(signal.SIGHUP)

    @property
    def armed(self) -> bool:
        return self.signum is not None

    def remaining_s(self) -> float | None:
        """Seconds the clean path has left; None before any signal."""
        if self._t0 is None:
            return None
        return max(0.0, self._t0 + self.deadline_s - time.monotonic())

    def note(self, text: str) -> None:
        """Once armed: a line in stderr.log with the time since the signal (where it went)."""
        if self._t0 is not None:
            _log(f"{text} ({time.monotonic() - self._t0:.2f} s)")

    def exit_code(self) -> int:
        return 128 + int(self.signum or signal.SIGTERM)

    # the guard's thread ---------------------------------------------------------------------
    def _run(self) -> None:
        self._armed.wait()
        if self.detach is not None:
            with contextlib.suppress(Exception):
                self.terminal_lost = self.detach() or self.terminal_lost
        signum = int(self.signum or signal.SIGTERM)
        reason = ("interrupted (terminal lost)" if self.terminal_lost and signum == signal.SIGHUP
                  else f"interrupted ({signal.Signals(signum).name})")
        with contextlib.suppress(Exception):
            self.ask_quit(signum, reason)
        _log(f"{reason}: quitting; the process ends within "
             f"{self.deadline_s + self.final_s:g} s")
        hurried = self._hurry.wait(self.deadline_s)
        self.forced = True
        _log(f"{'a second signal' if hurried else 'the clean quit did not finish in time'}: "
             "ending the run from the exit guard")
        self._end(reason, self.hurry_s if hurried else self.final_s)

    def _end(self, reason: str, budget_s: float) -> None:
        """The clean path did not finish in time: finish the run folder here, then leave."""
        t_end = time.monotonic() + budget_s
        if self.end_now is not None:
            with contextlib.suppress(Exception):
                self.end_now(reason, max(0.1, budget_s - 0.2))
        if self.restore is not None and not self.terminal_lost:
            _bounded(self.restore, max(0.05, t_end - time.monotonic()))
        _bounded(sys.stdout.flush, 0.05)
        _log(f"exit {self.exit_code()} after {time.monotonic() - (self._t0 or 0):.2f} s")
        os._exit(self.exit_code())


def _bounded(fn: Callable[[], None], timeout_s: float) -> None:
    """Run ``fn`` on a daemon thread and wait at most ``timeout_s`` (a write to a terminal
    that nobody reads blocks)."""
    def target() -> None:
        with contextlib.suppress(Exception):
            fn()

    thread = threading.Thread(target=target, name="memtop-bounded", daemon=True)
    thread.start()
    thread.join(timeout_s)


def _log(text: str) -> None:
    """One line into fd 2: the run's stderr.log while the dashboard runs (never the terminal)."""
    with contextlib.suppress(OSError):
        os.write(2, f"memtop: exit guard: {text}\n".encode())
