"""The real `memtop train` dashboard on a pseudo-terminal that goes away, in each state.

A dropped SSH session closes the terminal's master side: the kernel hangs the tty up (SIGHUP to
the session, EIO on every later write) and sshd's process group gets SIGHUP. Whatever memtop is
doing then, it must be gone within a few seconds with its run folder complete: every finished
step, run_finished last, the report, no child process left. tui/exit_guard.py, README "When
things go wrong". The dashboard reads its keys from the pty, as from a user.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from factories import METRICS, ONE_THREAD, ROOT, TINY_ARGS, read_jsonl, subprocess_env

pytestmark = pytest.mark.slow  # each test starts a memtop on a pty and takes it to a state

GONE_WITHIN_S = 5.0  # the promise: no memtop left 5 s after the terminal went away
READY_S = 120.0  # how long a state may take to come about on a loaded machine

# Become a session leader with the pty as controlling terminal (as a login shell's child is),
# then become memtop itself (same pid): closing the master then hangs up *its* terminal.
LAUNCH = ("import fcntl, os, sys, termios; os.setsid(); fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
          "os.execv(sys.executable, [sys.executable, '-m', 'tui.cli', *sys.argv[1:]])")


class Terminal:
    """memtop on a pty whose output is drained (and kept) by a thread, as a terminal does."""

    def __init__(self, run_root: Path, *args: str) -> None:
        import fcntl
        import struct
        import termios

        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        env = subprocess_env(TERM="xterm-256color", **ONE_THREAD)  # it runs beside the suite
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCH, "train", "--run-dir", str(run_root), "--steps", "0",
             *TINY_ARGS, *args],
            cwd=ROOT, env=env, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
        os.close(slave)
        self.run_root = run_root
        self.shown = bytearray()
        self._closing = threading.Event()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        self.children: list[psutil.Process] = []  # every descendant seen while it ran

    def _drain(self) -> None:
        while not self._closing.is_set():
            if select.select([self.master], [], [], 0.05)[0]:
                try:
                    data = os.read(self.master, 1 << 16)
                except OSError:  # EIO: the other side is gone
                    return
                if not data:
                    return
                self.shown.extend(data)

    def press(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    @property
    def run_dir(self) -> Path | None:
        found = list(self.run_root.glob(f"*/{METRICS}"))
        return found[0].parent if found else None

    def text(self) -> str:
        """metrics.jsonl as written so far (polled: substring checks, no parsing)."""
        run = self.run_dir
        return (run / METRICS).read_text() if run is not None else ""

    def wait_until(self, condition, what: str) -> None:
        """Until ``condition()``; fails (with the screen) if memtop died or it never came."""
        deadline = time.monotonic() + READY_S
        while not condition():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"never got to: {what} (exit {self.proc.poll()}); screen "
                                     f"tail: {bytes(self.shown[-1500:])!r}")
            time.sleep(0.1)  # polling interval of a condition, not a wait for an outcome

    def wait_for_event(self, name: str) -> None:
        self.wait_until(lambda: f'"event":"{name}"' in self.text(), name)

    def steps(self) -> int:
        return self.text().count('"loss":')

    def note_children(self) -> None:
        with_children = psutil.Process(self.proc.pid).children(recursive=True)
        self.children += [c for c in with_children if c not in self.children]

    def hang_up(self) -> None:
        """What a dropped SSH connection does: the master side closes, the group gets SIGHUP."""
        self._closing.set()
        self._reader.join()
        os.close(self.master)
        self.master = -1
        try:
            os.killpg(self.proc.pid, signal.SIGHUP)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self.master >= 0:
            self._closing.set()
            self._reader.join()
            os.close(self.master)
            self.master = -1
        for child in self.children:
            if _alive(child):
                child.kill()


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE  # PID 1 here may never reap it
    except psutil.NoSuchProcess:
        return False


def _help_shown(term: Terminal) -> bool:
    # the help's border title (always on screen; the key list's "? this help (esc closes)"
    # line scrolls below 24 rows as keys are added)
    return b"esc or ? closes" in term.shown or b"esc closes" in term.shown


# the window's wait steps, which the analysis child spends idle: ~1 s of tiny steps to find it
# in (with the default wait of 1 it may live ~0.2 s in all and be missed between two looks)
ANALYSIS_WAIT = ("--profile-wait", "100")


def _stop_analysis_worker(term: Terminal) -> None:
    """Freeze the profiler's analysis child, so the table stays "being analysed" until the
    terminal goes (on this machine the child may otherwise finish first). The run must have
    been started with ANALYSIS_WAIT."""
    term.wait_for_event("profile_started")  # the worker starts, idle, with the window

    def worker() -> psutil.Process | None:
        term.note_children()
        return next((c for c in term.children if _alive(c)
                     and "probes.traces.opstable" in " ".join(c.cmdline())), None)

    term.wait_until(lambda: worker() is not None, "the analysis worker")  # (notes children)
    found = worker()
    assert found is not None
    found.suspend()
    term.wait_for_event("profile_analysing")
    assert '"event":"profile_done"' not in term.text()


def _leak_and_help(term: Terminal) -> None:
    """Running with the leak demo on and the help screen open over the dashboard."""
    term.press("l")
    term.wait_for_event("leak_demo_started")
    term.press("?")
    term.wait_until(lambda: _help_shown(term), "the help screen")


# state -> (extra memtop options, how to get there). Each case starts a memtop (seconds of
# CPU on two cores), so states that do not interfere share one: the help screen lives in the
# UI, the leak demo in the trainer.
STATES = {
    "running, leak demo on, help screen open": ((), _leak_and_help),
    "paused": ((), lambda t: (t.press(" "), t.wait_for_event("paused"))),
    "profiler window open": (("--profile-active", "10000"),
                             lambda t: (t.press("p"), t.wait_for_event("profile_started"))),
    "table being analysed": (ANALYSIS_WAIT, lambda t: (t.press("p"), _stop_analysis_worker(t))),
}


def _check_run_folder(term: Terminal, reasons: tuple[str, ...], steps: int = 3) -> dict:
    run = term.run_dir
    assert run is not None
    rows = read_jsonl(run / METRICS)  # every line complete, valid JSON
    done = [r["step"] for r in rows if "event" not in r]
    assert done == list(range(1, len(done) + 1)) and len(done) >= steps
    last = rows[-1]
    assert last["event"] == "run_finished", last
    assert last["reason"].startswith(reasons), last
    assert [r for r in rows if r.get("event") == "run_finished"] == [last]
    report = json.loads((run / "report.json").read_text())
    assert (run / "report.md").is_file() and report
    assert "Traceback" not in (run / "stderr.log").read_text()
    assert not (run / "control.sock").exists()
    return last


def _check_gone(term: Terminal, code: int) -> None:
    try:
        term.proc.wait(timeout=GONE_WITHIN_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"memtop still running {GONE_WITHIN_S:g} s after the terminal "
                             "went away") from None
    assert term.proc.returncode == code
    assert not [c for c in term.children if _alive(c)], "a child process was left behind"


@pytest.fixture
def terminal(tmp_path):
    made: list[Terminal] = []

    def start(*args: str, steps: int = 3) -> Terminal:
        term = Terminal(tmp_path / "runs", *args)
        made.append(term)
        term.wait_until(lambda: term.steps() >= steps, "the first steps")
        return term

    yield start
    for term in made:
        term.close()


@pytest.mark.parametrize("state", list(STATES))
def test_terminal_hangs_up(terminal, state):
    extra, reach = STATES[state]
    term = terminal(*extra)
    reach(term)
    term.note_children()
    term.hang_up()
    _check_gone(term, 128 + signal.SIGHUP)
    _check_run_folder(term, ("interrupted (SIGHUP)", "interrupted (terminal lost)"))


def test_stuck_quit_then_sigterm_twice(terminal):
    """`q` while the table is analysed waits for the analysis; here it never ends (the child
    is frozen). SIGTERM then arms the exit guard; a second SIGTERM ends the process at once,
    with the run folder finished for the trainer still waiting inside the run's end."""
    term = terminal(*ANALYSIS_WAIT)
    term.press("p")
    _stop_analysis_worker(term)
    term.note_children()
    term.press("q")
    term.wait_until(lambda: b"stopping" in term.shown, "the quit under way")
    log = term.run_dir / "stderr.log"
    term.proc.send_signal(signal.SIGTERM)
    term.wait_until(lambda: "exit guard: interrupted (SIGTERM): quitting" in log.read_text(),
                    "the first SIGTERM taken")
    term.proc.send_signal(signal.SIGTERM)
    _check_gone(term, 128 + signal.SIGTERM)
    assert "exit guard: a second signal" in log.read_text()
    _check_run_folder(term, ("stopped by user",))
