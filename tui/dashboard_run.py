"""The dashboard on a real terminal: fd 2 into the run's log, a clean quit on SIGTERM/SIGHUP, and a
bounded shutdown that says what it waits for.

A kill or a dropped SSH session must not leave the terminal in raw mode, the run without its
run_finished row, or the folder without a report: both signals take the same path as `q`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from trainer.config import TrainConfig
from tui.app import MemtopApp
from tui.run_end import say

QUIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
SHUTDOWN_WAIT_S = 10.0  # after a forced quit: how long the step in flight may take to end


@contextlib.contextmanager
def stderr_to_file(path: Path) -> Iterator[TextIO]:
    """fd 2 -> ``path`` while the app owns the terminal; Textual keeps drawing on the terminal.

    Textual draws on ``sys.__stderr__`` (linux_driver: ``self._file = sys.__stderr__``), and
    torch's C++ side (profiler, allocator warnings) writes straight to fd 2. So fd 2 is pointed
    at the run's stderr.log, and ``sys.__stderr__``/``sys.stderr`` at a copy of the old fd 2.
    """
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    saved_fd = os.dup(2)
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    old_dunder, old_stderr = sys.__stderr__, sys.stderr
    encoding = getattr(old_dunder, "encoding", None) or "utf-8"
    term = open(saved_fd, "w", encoding=encoding, errors="replace", closefd=False)
    try:
        os.dup2(log_fd, 2)
        sys.__stderr__ = sys.stderr = term
        yield term
    finally:
        sys.__stderr__, sys.stderr = old_dunder, old_stderr
        with contextlib.suppress(Exception):
            term.close()  # flushes; the fd itself is closed below, after fd 2 is restored
        os.dup2(saved_fd, 2)
        os.close(saved_fd)
        os.close(log_fd)


@contextlib.contextmanager
def quit_on_signals(app: MemtopApp,
                    signals: tuple[signal.Signals, ...] = QUIT_SIGNALS) -> Iterator[None]:
    """While the block runs, ``signals`` ask ``app`` for a clean quit; old handlers come back.

    Python runs the handler on the main thread between two bytecodes, possibly in the middle
    of the event loop's own code, so it only hands the request to the loop (app.signal_quit).
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal.signal() works on the main thread only
        return

    def handler(signum: int, _frame: object) -> None:
        app.signal_quit(signum)

    previous: dict[signal.Signals, object] = {}
    try:
        for sig in signals:
            previous[sig] = signal.signal(sig, handler)
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)  # type: ignore[arg-type]


def run_dashboard(config: TrainConfig, run_dir: Path) -> int:
    """``memtop train`` on a terminal: the app until q (or SIGTERM/SIGHUP), then the paths.

    Exit status: 0 stopped or finished, 1 training failed, 128 + N after signal N (as headless).
    """
    app = MemtopApp.for_run(config, run_dir, deferred=True)  # torch: on the trainer thread
    with stderr_to_file(Path(run_dir) / "stderr.log"), quit_on_signals(app):
        try:
            app.run()
        finally:
            app.shutdown(SHUTDOWN_WAIT_S, out=sys.stdout)  # the terminal is restored by now
    say(sys.stdout, f"memtop: run folder {run_dir}")
    if app.report_path is not None:
        say(sys.stdout, f"memtop: report {app.report_path}")
    if app.quit_signal is not None:
        return 128 + app.quit_signal
    code = app.return_code
    return app.exit_code() if code is None else code
