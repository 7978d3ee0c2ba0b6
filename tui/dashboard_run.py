"""The dashboard on a real terminal: fd 2 into the run's log, a clean quit on SIGTERM/SIGHUP/
SIGINT or a lost terminal, and an exit that never waits on the terminal.

A kill or a dropped SSH session must not leave the terminal in raw mode, the run without its
run_finished row, the folder without a report, or the process alive: every signal takes the
same path as `q`, and tui/exit_guard.py ends the process by a deadline if that path is stuck.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TextIO

from trainer.config import TrainConfig
from tui.app import MemtopApp
from tui.exit_guard import ExitGuard
from tui.output import say

QUIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
SHUTDOWN_WAIT_S = 10.0  # after `q` pressed twice: how long the step in flight may take to end
# What Textual's stop_application_mode writes, for a forced exit on a terminal still there.
TERMINAL_RESET = ("\x1b[?2004l\x1b[?7h\x1b[?1000l\x1b[?1003l\x1b[?1015l\x1b[?1006l"
                  "\x1b[<u\x1b[?1049l\x1b[?25h\x1b[?1004l")


class TerminalStream:
    """The terminal as Textual's writer thread sees it: a write that fails (EIO once the tty
    has hung up, EPIPE) marks the terminal lost and calls ``on_lost`` once; every later write
    is dropped. Textual's own writer thread dies on such an error, after which its queue fills
    and the event loop blocks forever on the next write (docs/ARCHITECTURE.md, measured facts)."""

    def __init__(self, raw: TextIO, on_lost: Callable[[], None] | None = None) -> None:
        self._raw = raw
        self.on_lost = on_lost
        self.lost = False

    def _failed(self) -> None:
        if not self.lost:
            self.lost = True
            if self.on_lost is not None:
                with contextlib.suppress(Exception):
                    self.on_lost()

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                return self._raw.write(text)
            except (OSError, ValueError):
                self._failed()
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self._raw.flush()
            except (OSError, ValueError):
                self._failed()

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._raw.close()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding ...
        return getattr(self._raw, name)


@contextlib.contextmanager
def stderr_to_file(path: Path) -> Iterator[TerminalStream]:
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
    term = TerminalStream(open(saved_fd, "w", encoding=encoding, errors="replace",
                               closefd=False))
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
def quit_on_signals(guard: ExitGuard,
                    signals: tuple[signal.Signals, ...] = QUIT_SIGNALS) -> Iterator[None]:
    """While the block runs, ``signals`` go to ``guard`` (which asks the app for a clean quit
    from its own thread); the old handlers come back afterwards.

    Python runs a handler on the main thread between two bytecodes, possibly in the middle of
    the event loop's own code or while it holds a lock: the handler only sets flags.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal.signal() works on the main thread only
        return

    def handler(signum: int, _frame: object) -> None:
        guard.on_signal(signum)

    previous: dict[signal.Signals, object] = {}
    try:
        for sig in signals:
            previous[sig] = signal.signal(sig, handler)
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)  # type: ignore[arg-type]


def terminal_restorer(fd: int) -> Callable[[], None] | None:
    """Put the terminal back as it was (modes, screen, cursor) after a forced exit."""
    import termios

    try:
        attrs = termios.tcgetattr(fd)
    except (termios.error, OSError):
        return None

    def restore() -> None:
        with contextlib.suppress(termios.error, OSError):
            termios.tcsetattr(fd, termios.TCSANOW, attrs)
        os.write(fd, TERMINAL_RESET.encode())

    return restore


def terminal_detacher(fd: int) -> Callable[[], bool]:
    """If the terminal on ``fd`` has hung up, put an empty pipe in its place and say so.

    A hung-up tty is always "readable" and reads as EOF, so Textual's input thread would loop
    on select() + read() as fast as it can, holding the GIL the quit needs (measured: ~70k
    turns a second). A pipe nobody writes to makes its select() wait again. A terminal that
    is still there (a SIGHUP sent by hand) is left alone, so it can be restored.
    """
    import errno
    import termios

    kept: list[int] = []

    def detach() -> bool:
        try:
            termios.tcgetattr(fd)
            return False
        except termios.error as exc:
            if not exc.args or exc.args[0] != errno.EIO:
                return False
        read_end, write_end = os.pipe()
        os.dup2(read_end, fd)
        os.close(read_end)
        kept.append(write_end)  # open, never written: reads wait instead of seeing EOF
        return True

    return detach


def run_dashboard(config: TrainConfig, run_dir: Path) -> NoReturn:
    """``memtop train`` on a terminal: the app until q (or a signal, or the terminal gone),
    then the paths.

    Exit status: 0 stopped or finished, 1 training failed, 128 + N after signal N (as
    headless; 129 when the terminal went away without a SIGHUP). It never returns: see _leave.
    """
    run_app(MemtopApp.for_run(config, run_dir, deferred=True), run_dir)  # torch: trainer thread


def run_infer_dashboard(config: object, spec: object, run_dir: Path) -> NoReturn:
    """``memtop infer`` on a terminal: the same app over the inference runner."""
    run_app(MemtopApp.for_infer(config, spec, run_dir), run_dir)


def run_app(app: MemtopApp, run_dir: Path) -> NoReturn:
    """The app over a runner of this process (trainer or inference) until q, a signal or the
    terminal gone; the exit guard bounds how long that may take (tui/exit_guard.py)."""
    ending = app.ending
    assert ending is not None

    def ask_quit(signum: int, reason: str) -> None:
        ending.control.stop(reason, urgent=True)  # the runner acts on it at its next boundary
        app.signal_quit(signum)  # the UI: the same path as `q`

    stdin = sys.__stdin__.fileno()
    guard = ExitGuard(ask_quit, ending.end_now, terminal_restorer(stdin),
                      terminal_detacher(stdin))
    with stderr_to_file(Path(run_dir) / "stderr.log") as term, quit_on_signals(guard):
        term.on_lost = guard.on_terminal_lost
        try:
            app.run()
        finally:
            guard.note("the dashboard has closed")
            remaining = guard.remaining_s()
            wait_s = SHUTDOWN_WAIT_S if remaining is None else remaining
            app.shutdown(wait_s, out=None if guard.armed else sys.stdout)
            guard.note("the run folder is finished")
    out = None if term.lost else sys.stdout
    say(out, f"memtop: run folder {run_dir}")
    if app.report_path is not None:
        say(out, f"memtop: report {app.report_path}")
    if guard.armed:
        code = guard.exit_code()
    else:
        code = app.return_code if app.return_code is not None else app.exit_code()
    _leave(code)


def _leave(code: int) -> NoReturn:
    """End the process now that the run folder is complete and the terminal restored.

    The interpreter's own teardown serves nothing here and costs seconds: its final garbage
    collections walk torch's and Textual's few hundred thousand objects (3-8 s measured on
    this 2-core machine under load), and a training thread abandoned inside a step would
    still be running torch code while modules are torn down.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
