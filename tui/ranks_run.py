"""``memtop train --nproc N``: the ranks under torch.distributed.run, watched from this process.

The ranks write the run folder (trainer/rank.py); this process follows it like `memtop view`
does: headless, one line per rank every few steps; with the dashboard, the viewer app over the
folder, whose `q` ends every rank together (trainer/launch.py). At the end: which rank failed
and why (probes/analysis/ranks.py), and one report for all ranks.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from probes.analysis.ranks import failure_text, rank_ends, read_process_exits
from probes.records import Record, StepSample
from probes.runfolder import TORCHRUN_LOG, metrics_files
from trainer.config import TrainConfig
from trainer.exit_codes import (
    EXIT_FAILED,
    EXIT_MEMORY_GUARD,
    EXIT_OK,
    EXIT_SIGHUP,
    EXIT_SIGINT,
    EXIT_SIGTERM,
)
from trainer.launch import KILL_GRACE_S, RankLaunch, rank_threads
from tui.headless import (
    HeadlessPrinter,
    format_event_line,
    format_step_line,
)
from tui.output import say

POLL_S = 0.2
START_TIMEOUT_S = 180.0  # until a rank has written its first row (imports, rendezvous)


class RankPrinter(HeadlessPrinter):
    """The headless lines, each led by its rank."""

    def __call__(self, record: Record) -> None:
        tag = f"[rank {record.rank}] "
        if isinstance(record, StepSample):
            if record.step % self.log_every == 0 or record.step == 1:
                print(tag + format_step_line(record), file=self.out, flush=True)
        elif record.kind is not None and record.kind.loud:
            print(tag + format_event_line(record), file=self.out, flush=True)


class RankFollower:
    """Follows the ranks' files as they appear (FolderSource, made once the first exists)."""

    def __init__(self, run_dir: Path, nproc: int) -> None:
        self.run_dir = run_dir
        self.nproc = nproc
        self.source = None
        self.step_ms: dict[int, float] = {}  # each rank's last step time

    def poll(self) -> list[Record]:
        from tui.sources import FolderSource

        out: list[Record] = []
        if self.source is None:
            if not metrics_files(self.run_dir):
                return out
            self.source = FolderSource(self.run_dir, expected_ranks=self.nproc)
            self.source.start()
            out += self.source.history()[0]
        out += self.source.poll()
        for r in out:
            if isinstance(r, StepSample):
                self.step_ms[r.rank] = r.step_ms
        return out

    def typical_step_ms(self) -> float | None:
        vals = sorted(self.step_ms.values())
        return vals[len(vals) // 2] if vals else None

    def close(self) -> None:
        if self.source is not None:
            self.source.close()


def ranks_exit_code(run_dir: Path, code: int | None) -> int:
    """One status for all ranks (trainer/exit_codes.py): a guard stop in any rank is 3, as
    for one process, so a CI job can tell it from a failure; then a failure is 1."""
    if any(e.guard_step is not None for e in rank_ends(run_dir)):
        return EXIT_MEMORY_GUARD
    return EXIT_FAILED if end_lines(run_dir, code)[1] else EXIT_OK


def end_lines(run_dir: Path, code: int | None) -> tuple[list[str], bool]:
    """What the terminal hears once torchrun has ended, and whether a rank failed."""
    ends = rank_ends(run_dir)
    text = failure_text(ends, read_process_exits(run_dir))
    lines = [f"memtop: rank {e.rank}: {e.steps} steps, "
             + (f"failed: {e.error}" if e.error else e.finished or "no run_finished row")
             for e in ends]
    guarded = [e for e in ends if e.guard_step is not None]
    if guarded:
        lines.append("memtop: the memory guard (--max-memory) stopped "
                     + ", ".join(f"rank {e.rank} at step {e.guard_step}" for e in guarded)
                     + f"; exit status {EXIT_MEMORY_GUARD}")
    if text:
        lines.append(f"memtop: {text} (torchrun's output: {run_dir / TORCHRUN_LOG})")
    elif code:
        lines.append(f"memtop: torchrun ended with exit status {code}; see "
                     f"{run_dir / TORCHRUN_LOG}")
    return lines, bool(text) or bool(code)


def run_ranks_headless(config: TrainConfig, run_dir: Path, log_every: int = 10,
                       out: TextIO | None = None) -> int:
    """Launch, print each rank's lines until torchrun ends; Ctrl-C ends every rank together."""
    from tui.finish import finish_run

    out = out or sys.stdout
    launch = RankLaunch(config, run_dir)
    follower = RankFollower(run_dir, config.nproc)
    printer = RankPrinter(log_every, out)
    say(out, f"memtop: run folder {run_dir}")
    say(out, f"memtop: {config.nproc} ranks through torch.distributed.run, "
             f"{rank_threads(config.nproc)} threads each; its output goes to {TORCHRUN_LOG}")
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        if signum == signal.SIGHUP and signal.SIGHUP in received:
            return  # a terminal's repeated hangup is not an "again, at once"
        received.append(signum)
        name = signal.Signals(signum).name
        if len(received) == 1:
            say(out, f"memtop: {name} received, stopping every rank at the same step "
                     "(again to end them at once)")
        launch.stop("interrupted (terminal lost)" if signum == signal.SIGHUP else
                    f"interrupted ({name})", follower.typical_step_ms())

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
                continue  # nohup: the ranks are meant to outlive the terminal
            previous[sig] = signal.signal(sig, on_signal)
    try:
        launch.start()
        while launch.poll() is None:
            for record in follower.poll():
                printer(record)
            time.sleep(POLL_S)
        for record in follower.poll():
            printer(record)
    finally:
        follower.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    code = launch.poll()
    lines, _ = end_lines(run_dir, code)
    for line in lines:
        say(out, line)
    if metrics_files(run_dir):
        finish_run(run_dir, out)
    if received:
        return {signal.SIGINT: EXIT_SIGINT, signal.SIGHUP: EXIT_SIGHUP}.get(received[0],
                                                                             EXIT_SIGTERM)
    return ranks_exit_code(run_dir, code)


class LaunchEnd:
    """How a dashboard over launched ranks ends (the app's ``ending``, as RunEnd is for one
    trainer thread): q stops every rank at one agreed step, waits for torchrun, and writes
    one report for all ranks."""

    def __init__(self, launch: RankLaunch, source: Any) -> None:
        self.launch = launch
        self.source = source
        self.run_dir = launch.run_dir
        self.finished = False
        self.report_path: Path | None = None
        self._lock = threading.Lock()

    @property
    def control(self) -> LaunchEnd:
        return self  # the app calls ending.control.stop() when it goes away

    def stop(self, reason: str = "stopped by user") -> None:
        if self.launch.running:
            self.launch.stop(reason, self.source.step_ms)

    def stop_in_background(self, reason: str, then: Callable[[], None]) -> None:
        self.stop(reason)

        def wait_and_finish() -> None:
            self.launch.wait()
            self.finish()
            then()

        threading.Thread(target=wait_and_finish, name="memtop-quit", daemon=True).start()

    def finish(self) -> Path | None:
        from tui.finish import finish_run

        with self._lock:
            if not self.finished:
                self.report_path = finish_run(self.run_dir, None) if metrics_files(
                    self.run_dir) else None
                self.finished = True
        return self.report_path

    def exit_code(self) -> int:
        code = self.launch.poll()
        if code is None:
            return 0
        return ranks_exit_code(self.run_dir, code)

    def shutdown(self, timeout_s: float, out: TextIO | None = None) -> None:
        self.stop()
        if self.launch.wait(min(0.5, timeout_s)) is None:
            say(out, f"memtop: waiting up to {timeout_s:g} s for the {self.launch.nproc} ranks "
                     "to stop at the same step…")
            if self.launch.wait(timeout_s) is None:
                self.launch.terminate()
                say(out, "memtop: asked torchrun to end the ranks (SIGTERM)…")
                self.launch.wait(KILL_GRACE_S + 5)
        if not self.launch.running:
            self.finish()
            for line in end_lines(self.run_dir, self.launch.poll())[0]:
                say(out, line)


def run_ranks_dashboard(config: TrainConfig, run_dir: Path) -> int:
    """The viewer app over the ranks' folder in this process; q ends every rank together."""
    from tui.app import MemtopApp
    from tui.dashboard_run import (
        SHUTDOWN_WAIT_S,
        quit_on_signals,
        stderr_to_file,
        terminal_detacher,
        terminal_restorer,
    )
    from tui.exit_guard import ExitGuard
    from tui.sources import LaunchSource

    launch = RankLaunch(config, run_dir)
    say(sys.stdout, f"memtop: starting {config.nproc} ranks through torch.distributed.run "
                    f"(run folder {run_dir})…")
    launch.start()
    try:
        started = launch.wait_started(START_TIMEOUT_S)
    except KeyboardInterrupt:
        started = False
    if not started:
        launch.terminate()
        launch.wait(KILL_GRACE_S + 5)
        lines, _ = end_lines(run_dir, launch.poll())
        for line in lines or [f"memtop: the ranks did not start; see {run_dir / TORCHRUN_LOG}"]:
            say(sys.stdout, line)
        return 1
    source = LaunchSource(launch)
    ending = LaunchEnd(launch, source)
    app = MemtopApp(source, ending=ending, device_type=source.device_type)
    stdin = sys.__stdin__.fileno()
    # a signal or a lost terminal: the same quit as q (every rank stops together); the guard
    # ends this process if the UI cannot (tui/exit_guard.py)
    guard = ExitGuard(lambda signum, _reason: app.signal_quit(signum),
                      restore=terminal_restorer(stdin), detach=terminal_detacher(stdin))
    with stderr_to_file(Path(run_dir) / "stderr.log") as term, quit_on_signals(guard):
        term.on_lost = guard.on_terminal_lost
        try:
            app.run()
        finally:
            app.shutdown(SHUTDOWN_WAIT_S, out=None if guard.armed else sys.stdout)
    say(sys.stdout, f"memtop: run folder {run_dir}")
    if app.report_path is not None:
        say(sys.stdout, f"memtop: report {app.report_path}")
    if app.quit_signal is not None:
        return 128 + app.quit_signal
    return ending.exit_code()
