"""The real terminal the benchmarks drive memtop in: a detached tmux pane on a private server
(``TmuxPane``), the memtop command lines they run (``memtop_argv``, ``TINY``) and the run folder
that command makes (``run_folder``). Shared by the cases that run memtop in a real terminal
(dashboard_overhead, startup, ui_latency, memory_soak, view_cost); the /proc readers beside it
are procfs.py.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness.paths import ROOT


class TmuxPane:
    """One detached tmux session on a private server (-L): the real terminal memtop draws on."""

    socket = f"memtop-bench-{os.getpid()}"
    conf = "/dev/null"
    _server_started = False

    def __init__(self, name: str, width: int, height: int, argv: list[str],
                 cwd: Path = ROOT, env: dict[str, str] | None = None) -> None:
        if shutil.which("tmux") is None:
            raise SystemExit("tmux is not installed: the dashboard needs a real terminal")
        self.name = name
        if not TmuxPane._server_started:
            fd, conf = tempfile.mkstemp(prefix="memtop-tmux-", suffix=".conf")
            # remain-on-exit keeps the pane (and its last screen) after the app exits.
            os.write(fd, b"set -g remain-on-exit on\nset -g history-limit 100\n"
                         b"set -g status off\n")
            os.close(fd)
            TmuxPane.conf = conf
            TmuxPane._server_started = True
            atexit.register(TmuxPane.kill_server)
        env_args: list[str] = []
        for key, value in (env or {}).items():
            env_args += ["-e", f"{key}={value}"]
        # tmux reaps a finished pane's process late (seconds): a shell writes the exit status
        # to a file instead, and the app's pid is the shell's child.
        fd, status = tempfile.mkstemp(prefix="memtop-status-")
        os.close(fd)
        os.unlink(status)
        self.status_path = Path(status)
        st = _quote(status)
        command = " ".join(_quote(a) for a in argv) + f"; echo $? > {st}.tmp && mv {st}.tmp {st}"
        self.started = time.perf_counter()
        self._tmux("new-session", "-d", "-s", name, "-x", str(width), "-y", str(height),
                   "-c", str(cwd), *env_args, command)
        shell = int(self.info("#{pane_pid}"))
        self.pid = _child_of(shell, timeout_s=10.0)

    @classmethod
    def _tmux(cls, *args: str, check: bool = True) -> str:
        res = subprocess.run(["tmux", "-L", cls.socket, "-f", cls.conf, *args],
                             capture_output=True, text=True, timeout=30)
        if check and res.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)}: {res.stderr.strip()}")
        return res.stdout

    def info(self, fmt: str) -> str:
        return self._tmux("display-message", "-p", "-t", self.name, fmt).strip()

    def capture(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", self.name, check=False)

    def send(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", self.name, *keys)

    @property
    def dead(self) -> bool:
        return self.status_path.exists()

    def exit_status(self) -> int | None:
        try:
            return int(self.status_path.read_text().strip())
        except (OSError, ValueError):
            return None

    def wait_dead(self, timeout_s: float) -> bool:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.dead:
                return True
            time.sleep(0.05)
        return False

    def kill(self) -> None:
        self._tmux("kill-session", "-t", self.name, check=False)
        for path in (self.status_path, self.status_path.with_name(self.status_path.name + ".tmp")):
            path.unlink(missing_ok=True)

    @classmethod
    def server_pid(cls) -> int | None:
        try:
            return int(cls._tmux("display-message", "-p", "#{pid}").strip())
        except (RuntimeError, ValueError):
            return None

    @classmethod
    def kill_server(cls) -> None:
        if cls._server_started:
            cls._tmux("kill-server", check=False)
            cls._server_started = False


def _child_of(parent: int, timeout_s: float) -> int:
    """The pid of the (first) child process of ``parent``, waiting for it to be forked."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == parent:
                return int(entry)
        time.sleep(0.01)
    raise RuntimeError(f"no child process of pane shell {parent}")


def _quote(arg: str) -> str:
    return arg if re.fullmatch(r"[\w@%+=:,./-]+", arg) else "'" + arg.replace("'", "'\\''") + "'"


SMOKE_ARGS: list[str] = []  # --amp, --smoke: added to every memtop command line of the run
TINY = ["--layers", "1", "--dim", "32", "--heads", "2", "--seq-len", "16", "--batch-size", "4"]


def apply_run_options(args) -> None:
    """A case's --amp and --smoke (a tiny model: checks the case works, nothing appended) onto
    every memtop command line it starts."""
    SMOKE_ARGS[:] = ["--amp", args.amp] if args.amp != "auto" else []
    if args.smoke:
        SMOKE_ARGS[:] = [*SMOKE_ARGS, *TINY]
        args.no_append = True


def memtop_argv(*args: str, gc_log: str | None = None) -> list[str]:
    args = (*args, *SMOKE_ARGS)
    if gc_log is not None:  # --diagnose: the same command, with gc pauses logged to a file
        return [sys.executable, "-c", GC_WRAPPER, gc_log, "train", *args]
    return [sys.executable, "-m", "tui.cli", "train", *args]


# Runs `python -m tui.cli ARGS` with a gc callback that logs every collection (wall time, the
# generation, how long, on which thread) and dumps them at exit into the file argv[1].
GC_WRAPPER = r"""
import atexit, gc, json, runpy, sys, threading, time
log, started = [], {}
def on_gc(phase, info):
    now = time.perf_counter()
    tid = threading.get_ident()
    if phase == "start":
        started[tid] = now
    elif tid in started:
        t0 = started.pop(tid)
        log.append((time.time() - (now - t0), info["generation"], now - t0,
                    threading.current_thread().name))
gc.callbacks.append(on_gc)
path = sys.argv.pop(1)
def dump():
    with open(path, "w") as fh:
        json.dump({"gc": log, "switch_interval": sys.getswitchinterval(),
                   "frozen": gc.get_freeze_count()}, fh)
atexit.register(dump)
sys.argv[0] = "memtop"
runpy.run_module("tui.cli", run_name="__main__", alter_sys=True)
"""


def run_folder(root: Path, timeout_s: float = 60.0) -> Path:
    """The one <timestamp>-<id>/ folder memtop makes under --run-dir ROOT."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        dirs = [d for d in root.iterdir() if d.is_dir()] if root.exists() else []
        if dirs:
            return dirs[0]
        time.sleep(0.05)
    raise RuntimeError(f"no run folder appeared under {root}")
