"""``memtop train --nproc N``: start N ranks through torch.distributed.run and end them together.

torch's own launcher does the work: ``python -m torch.distributed.run --standalone
--nproc-per-node N -m trainer.rank ...`` (its elastic agent, rendezvous and failure handling;
memtop adds no launcher of its own). This process only creates the run folder, starts that
command in its own session (a Ctrl-C on the terminal reaches memtop, not the ranks), and stops
the ranks *together*: every rank gets the same ``stop`` request for the same future step through
its socket, since a rank that stops one step before the others would leave them waiting in the
gradient all-reduce. If the ranks have not ended a few seconds later, torchrun gets SIGTERM and
its agent ends them (SIGTERM, then SIGKILL). torchrun's own output goes to torchrun.log.

No torch import here: the launching process is the viewer, and must not compete with the ranks.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from probes.control import agree_step
from probes.control.unix_socket import NotLive
from probes.control.unix_socket import request as send_request
from probes.runfolder import TORCHRUN_LOG, socket_name
from trainer.config import TrainConfig

STOP_LEAD_S = 1.0  # a stop is for the step about this far ahead (at least 3 steps)
STOP_GRACE_S = 8.0  # then torchrun's agent is asked to end the ranks (SIGTERM)
KILL_GRACE_S = 35.0  # its agent waits 30 s before SIGKILL; then memtop kills it


def rank_threads(nproc: int) -> int:
    """OpenMP threads per rank: the cores this process may use, shared out (two ranks
    with all the threads each slowed each other ~40x on 2 cores, docs/ARCHITECTURE.md)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, nproc))


def check_port(port: int) -> None:
    """ValueError when ``port`` (the rendezvous port asked for) is taken on this machine."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ValueError(f"port {port} is already in use; pick another --port or "
                                 "leave it at 0 for a free one") from None
            raise ValueError(f"cannot use port {port}: {exc.strerror or exc}") from None


def torchrun_command(config: TrainConfig, run_dir: Path) -> list[str]:
    """The torch.distributed.run command line that starts the ranks on this machine."""
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if config.port:
        cmd += ["--nnodes", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{config.port}"]
    else:
        cmd += ["--standalone"]
    cmd += ["--nproc-per-node", str(config.nproc), "--max-restarts", "0",
            "-m", "trainer.rank", "--run-folder", str(run_dir),
            # this process serves every rank's /metrics (memtop train --metrics-port): not
            # the ranks, whose local rank 0 would take the same port
            "--config", json.dumps({**config.to_json(), "metrics_port": None})]
    return cmd


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG


class RankLaunch:
    """The torchrun process of one run, and how it is asked to end."""

    def __init__(self, config: TrainConfig, run_dir: Path) -> None:
        self.config = config
        self.run_dir = Path(run_dir)
        self.nproc = config.nproc
        self.command = torchrun_command(config, self.run_dir)
        self.proc: subprocess.Popen[bytes] | None = None
        self.stop_reason: str | None = None
        self.escalated = False  # torchrun was sent SIGTERM (the ranks did not stop in time)
        self._stop_thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        env = dict(os.environ)
        threads = str(rank_threads(self.nproc))
        env.setdefault("OMP_NUM_THREADS", threads)
        env.setdefault("MKL_NUM_THREADS", env["OMP_NUM_THREADS"])
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        env.setdefault("KINETO_LOG_LEVEL", "5")
        env["PYTHONUNBUFFERED"] = "1"
        log = open(self.run_dir / TORCHRUN_LOG, "ab")
        try:
            self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True,
                                         preexec_fn=_die_with_parent)  # noqa: PLW1509
        finally:
            log.close()

    # state -------------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def poll(self) -> int | None:
        """torchrun's exit status once it has ended, else None."""
        return self.proc.poll() if self.proc is not None else 0

    @property
    def running(self) -> bool:
        return self.poll() is None

    def wait(self, timeout_s: float | None = None) -> int | None:
        if self.proc is None:
            return 0
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.proc.wait(timeout_s)
        return None

    def log_text(self) -> str:
        with contextlib.suppress(OSError):
            return (self.run_dir / TORCHRUN_LOG).read_text(encoding="utf-8", errors="replace")
        return ""

    # ending ------------------------------------------------------------------------------------
    def request_all(self, kind: str, at_step: int | None, reason: str | None = None) \
            -> str | None:
        """The same request for the same step to every rank's socket; None, or why not."""
        payload: dict = {"request": kind, "source": f"launcher pid {os.getpid()}"}
        if at_step is not None:
            payload["at_step"] = at_step
        if reason:
            payload["reason"] = reason
        errors = []
        for rank in range(self.nproc):
            try:
                answer = send_request(self.run_dir / socket_name(rank), payload)
            except NotLive as exc:
                errors.append(f"rank {rank}: {exc.strerror or exc}")
                continue
            if not answer.get("ok"):
                errors.append(f"rank {rank}: {answer.get('error')}")
        return "; ".join(errors) or None

    def stop(self, reason: str, step_ms: float | None = None) -> None:
        """End the run with every rank at the same step boundary, off the caller's thread.

        A second call (a second Ctrl-C, a second q) goes straight to torchrun's SIGTERM."""
        with self._lock:
            again = self._stop_thread is not None
            if not again:
                self.stop_reason = reason
                self._stop_thread = threading.Thread(target=self._stop, args=(reason, step_ms),
                                                     name="memtop-stop-ranks", daemon=True)
                self._stop_thread.start()
        if again:
            self.terminate()

    def _stop(self, reason: str, step_ms: float | None) -> None:
        if not self.running:
            return
        at_step, why_not = agree_step(self.run_dir, range(self.nproc), step_ms, STOP_LEAD_S)
        if why_not is None:
            why_not = self.request_all("stop", at_step, reason)
        wait_s = STOP_GRACE_S if why_not is None else 0.5
        if why_not is None and at_step is not None and step_ms:
            wait_s += STOP_LEAD_S + 3 * step_ms / 1000.0
        if self.wait(wait_s) is None:
            self.terminate()

    def terminate(self) -> None:
        """torchrun's agent ends the ranks (SIGTERM, SIGKILL after its own 30 s); after that
        memtop kills torchrun itself, whose ranks then get SIGTERM from the kernel."""
        with self._lock:
            first = not self.escalated
            self.escalated = True
        if not first or not self.running or self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)

        def reap() -> None:
            if self.wait(KILL_GRACE_S) is None and self.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()

        threading.Thread(target=reap, name="memtop-reap-torchrun", daemon=True).start()

    def wait_started(self, timeout_s: float, every_s: float = 0.1) -> bool:
        """Until a rank's metrics file exists, torchrun ends, or ``timeout_s`` passes."""
        from probes.runfolder import metrics_files

        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if metrics_files(self.run_dir) or not self.running:
                return bool(metrics_files(self.run_dir))
            time.sleep(every_s)
        return False
