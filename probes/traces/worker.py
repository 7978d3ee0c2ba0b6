"""The ops table's child process: started early and idle, told "go" once the trace is written,
killed with the process that started it (docs/ARCHITECTURE.md, "Profiler window"). The child is
a fresh interpreter running the ops table's command line (``python -m probes.traces.opstable``,
probes/traces/opstable.py): no torch, no GIL shared with training.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import weakref
from pathlib import Path
from typing import IO, Any

_WORKERS: weakref.WeakSet[subprocess.Popen[bytes]] = weakref.WeakSet()  # this process's


def spawn_worker(trace_path: Path, out_dir: Path, sort_by: str, top: int, use_device: bool,
                 profile_memory: bool, log: IO[Any] | int) -> subprocess.Popen[bytes]:
    """Start the ops table's analysis (probes/traces/opstable.py) in a fresh interpreter (no
    torch, no shared GIL), niced and detached from the terminal's Ctrl-C (a stopping run still
    collects its table).

    The worker starts idle and waits for a line on stdin: "go" analyses ``trace_path``, anything
    else (or EOF) exits. Starting a process costs the training ~50 ms of disturbed steps on two
    cores (and up to ~200 ms when it computes at once), so the window starts it early, during
    its wait/warmup steps, and only says "go" when the trace is written.
    """
    root = str(Path(__file__).resolve().parents[2])  # the folder holding probes/
    code = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
            "from probes.traces.opstable import main; sys.exit(main(sys.argv[1:]))")
    argv = [sys.executable, "-I", "-c", code, root, str(trace_path), str(out_dir),
            "--sort", sort_by, "--top", str(top), "--nice", "10", "--wait-for-go"]
    if use_device:
        argv.append("--device")
    if profile_memory:
        argv.append("--memory")
    argv += ["--parent", str(os.getpid())]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=log, close_fds=True, start_new_session=True)
    _WORKERS.add(proc)
    return proc


def analysis_pids() -> list[int]:
    """The pids of the analysis children this process started that still run: memtop's own,
    left out of the workers' memory (probes/counters/workers.py)."""
    return [proc.pid for proc in list(_WORKERS) if proc.returncode is None]


def kill_workers() -> int:
    """Kill every analysis worker this process started that is still running (a process that
    must leave now, from any thread); returns how many were killed."""
    killed = 0
    for proc in list(_WORKERS):
        if proc.returncode is None:
            with contextlib.suppress(OSError):
                proc.kill()
                killed += 1
    return killed


def die_with_parent(parent: int) -> None:
    """In the child: be killed when the process that started us dies, however it dies (SIGKILL
    included); a table nobody will read must not keep a CPU busy."""
    with contextlib.suppress(Exception):
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(1)

