"""Runs a sweep's cells: each in a fresh child process (`memtop train --headless`), one at a time,
so no cell's peaks carry the previous cell's allocations and no two torch processes share the
cores (two at once slowed each other ~40×, docs/ARCHITECTURE.md). The child's threads are left as
the environment sets them: it runs alone.

Ctrl-C, SIGTERM or a lost terminal (SIGHUP): the child (in its own session, so the terminal's
signal reaches only the sweep) is asked to stop at its next step boundary; every finished cell
is kept, the one in flight is "interrupted" and the rest are listed as not run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from probes.analysis.sweep import (
    INTERRUPTED,
    OK,
    Cell,
    cell_result,
    interrupted_row,
    not_run_row,
    write_outputs,
)
from probes.tools.units import format_bytes, format_clock, format_rate
from tui.output import quiet_stdout, say_all

CHILD_STOP_WAIT_S = 60.0  # after Ctrl-C: how long the cell in flight may take to stop
EXIT_SIGINT = 130


@dataclass
class SweepPlan:
    cells: list[Cell]
    folder: Path = Path("sweeps")  # the fresh sweep folder, set before running
    device: str = "auto"
    warmup_steps: int = 5
    steps: int = 20  # measured steps, after warmup
    heads: int | None = None  # None: each cell's follows its --dim (TrainConfig.from_options)
    block_size: int = 128
    seed: int = 1337
    max_memory_bytes: int | None = None
    command: str = ""
    extra: dict = field(default_factory=dict)

    def child_command(self, cell: Cell, root: Path) -> list[str]:
        cmd = [sys.executable, "-m", "tui.cli", "train", "--headless",
               "--device", self.device, "--amp", cell.amp,
               "--batch-size", str(cell.batch_size), "--seq-len", str(cell.seq_len),
               "--block-size", str(self.block_size), "--layers", str(cell.layers),
               *(["--heads", str(self.heads)] if self.heads else []), "--dim", str(cell.dim),
               "--attention", cell.attention, "--seed", str(self.seed),
               "--steps", str(self.warmup_steps + self.steps),
               "--warmup-steps", str(self.warmup_steps),
               "--log-every", str(self.warmup_steps + self.steps), "--run-dir", str(root)]
        if self.max_memory_bytes is not None:
            cmd += ["--max-memory", str(self.max_memory_bytes)]
        return cmd

    def meta(self) -> dict:
        return {"command": self.command, "device": self.device,
                "warmup_steps": self.warmup_steps, "measured_steps": self.steps,
                "heads": self.heads, "block_size": self.block_size, "seed": self.seed,
                "max_memory_bytes": self.max_memory_bytes, **self.extra}


class Progress:
    """A bar redrawn in place on a terminal; one line per finished cell everywhere."""

    def __init__(self, cells: list[Cell], out: TextIO, tty: bool) -> None:
        self.cells, self.total, self.out, self.tty = cells, len(cells), out, tty
        self.t0 = time.monotonic()
        self.walls: list[float] = []
        self.current: str = ""
        self.cell_t0 = self.t0

    def eta_s(self, done: int) -> float | None:
        """The cells left, each predicted by wall = s0 + k·B·T fitted on the finished ones
        (start-up plus work per token); the mean wall until two sizes have run."""
        if not self.walls:
            return None
        sizes = [c.batch_size * c.seq_len for c in self.cells[:len(self.walls)]]
        left = [c.batch_size * c.seq_len for c in self.cells[done:]]
        mean_x, mean_y = sum(sizes) / len(sizes), sum(self.walls) / len(self.walls)
        var = sum((x - mean_x) ** 2 for x in sizes)
        if var == 0:
            return mean_y * len(left)
        k = sum((x - mean_x) * (y - mean_y) for x, y in zip(sizes, self.walls, strict=True))
        k = max(0.0, k / var)
        s0 = max(0.0, mean_y - k * mean_x)
        return sum(s0 + k * x for x in left)

    def _bar(self, done: int) -> str:
        width = 20
        fill = int(width * done / self.total) if self.total else width
        eta = self.eta_s(done)
        return (f"sweep [{'#' * fill}{'-' * (width - fill)}] {done}/{self.total}  elapsed "
                f"{format_clock(time.monotonic() - self.t0)}  ETA "
                f"{'~' + format_clock(eta) if eta is not None else 'after the first cell'}")

    def start(self, done: int, cell: Cell) -> None:
        self.current, self.cell_t0 = cell.key, time.monotonic()
        self.tick(done)

    def tick(self, done: int) -> None:
        if self.tty:
            line = (f"{self._bar(done)}  running {self.current} "
                    f"({time.monotonic() - self.cell_t0:.0f} s)")
            self._write("\r\x1b[2K" + line)

    def finished(self, done: int, row: dict) -> None:
        self.walls.append(row.get("wall_s") or 0.0)
        what = (f"peak {format_bytes(row.get('peak_allocated_bytes'))}  "
                f"{format_rate(row.get('tokens_per_s_p50'))} tok/s  "
                f"step p50 {row.get('step_ms_p50') or 0:.1f} ms"
                if row["status"] == OK else str(row.get("reason")))
        line = (f"cell {done}/{self.total} {row['cell']}: {row['status']}  {what}  "
                f"({row.get('wall_s') or 0:.1f} s)")
        eta = self.eta_s(done)
        if not self.tty:
            line += (f"  elapsed {format_clock(time.monotonic() - self.t0)}"
                     + (f"  ETA ~{format_clock(eta)}" if eta is not None and done < self.total
                        else ""))
        self._write(("\r\x1b[2K" if self.tty else "") + line + "\n")

    def _write(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.out.write(text)
            self.out.flush()


def _wait_child(proc: subprocess.Popen, progress: Progress, done: int) -> int:
    """Wait for the cell, redrawing the bar; on Ctrl-C stop the child, then re-raise."""
    try:
        while True:
            try:
                return proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                progress.tick(done)
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):
            proc.send_signal(signal.SIGINT)  # stops at its next step boundary, run_finished
        try:
            proc.wait(timeout=CHILD_STOP_WAIT_S)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):  # too slow, or Ctrl-C again
            proc.kill()
            proc.wait()
        raise


def _run_cell(plan: SweepPlan, cell: Cell, index: int, progress: Progress) -> dict:
    root = plan.folder / "cells" / cell.key
    root.mkdir(parents=True, exist_ok=True)
    progress.start(index, cell)
    t0 = time.monotonic()
    with open(root / "child.log", "wb") as log:
        proc = subprocess.Popen(plan.child_command(cell, root), stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=os.environ.copy())
        rc = _wait_child(proc, progress, index)
    return cell_result(cell, root, rc, time.monotonic() - t0)


def _catch_signals(received: list[int]) -> dict[int, object]:
    """Ctrl-C, SIGTERM and a lost terminal (SIGHUP, unless ignored: nohup) raise
    KeyboardInterrupt here (main thread only), the signal noted in ``received``; returns the
    handlers to restore. Without it a SIGHUP killed the sweep before its files were written
    and left the cell in flight running on its own (it is in its own session)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}

    def interrupt(signum: int, _frame: object) -> None:
        if signum == signal.SIGHUP and signal.SIGHUP in received:
            return  # a terminal's repeated hangup: the cell in flight is already stopping
        received.append(signum)
        raise KeyboardInterrupt

    old: dict[int, object] = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
            continue
        old[sig] = signal.signal(sig, interrupt)
    return old


def run_sweep(plan: SweepPlan, out: TextIO | None = None, tty: bool | None = None,
              charts: object = None) -> tuple[int, dict]:
    """Every cell in turn; returns (exit status, sweep.json's data). ``charts(data, color)``
    gives the [(title, text)] charts for the markdown and the terminal."""
    out = out or sys.stdout
    tty = out.isatty() if tty is None else tty
    progress = Progress(plan.cells, out, tty)
    rows: list[dict] = []
    interrupted = False
    meta = plan.meta()
    progress._write(f"memtop: sweep folder {plan.folder} ({len(plan.cells)} cells)\n")
    # Ctrl-C stops the sweep even when it was started with SIGINT ignored (a shell's `&`
    # without job control), as `memtop train` handles it (tui/exit_guard.py)
    received: list[int] = []
    old_handlers = _catch_signals(received)
    try:
        for i, cell in enumerate(plan.cells):
            rows.append(_run_cell(plan, cell, i, progress))
            progress.finished(i + 1, rows[-1])
            write_outputs(plan.folder, dict(meta, partial=True), rows)  # a kill keeps what ran
    except KeyboardInterrupt:
        interrupted = True
        if progress.tty:
            progress._write("\n")
        if len(rows) < len(plan.cells):
            cell = plan.cells[len(rows)]
            root = plan.folder / "cells" / cell.key
            if root.is_dir() and any(p.is_dir() for p in root.iterdir()):
                rows.append(interrupted_row(cell, root))
    finally:
        for sig, handler in old_handlers.items():  # a hangup now must not cut the files short
            signal.signal(sig, signal.SIG_IGN if sig == signal.SIGHUP else handler)
    done = {r["cell"] for r in rows}
    rows += [not_run_row(c) for c in plan.cells if c.key not in done]
    final = dict(meta, partial=False, interrupted=interrupted,
                 wall_s=time.monotonic() - progress.t0)
    data = write_outputs(plan.folder, final, rows)
    md_charts = charts(data, False) if callable(charts) else []
    data = write_outputs(plan.folder, final, rows, md_charts)
    from probes.analysis.sweep import render_markdown

    text = render_markdown(data, charts(data, tty) if callable(charts) else [])
    text += (f"memtop: wrote {plan.folder}/sweep.md, sweep.json and sweep.csv in "
             f"{format_clock(final['wall_s'])}\n")
    if interrupted:  # the words of sweep.md: the cell in flight "interrupted", the rest "not run"
        stopped = [r["cell"] for r in rows if r["status"] == INTERRUPTED]
        text += (f"memtop: interrupted{' while running ' + stopped[0] if stopped else ''}; "
                 f"{len(data['not_run'])} cell(s) not run"
                 + (": " + ", ".join(data["not_run"]) if data["not_run"] else "") + "\n")
    with contextlib.suppress(OSError):  # a terminal gone (SIGHUP): the files are written
        if out is sys.stdout:
            say_all(text)  # `| head` ends the output, not the sweep's exit status
        else:
            out.write(text)
    if signal.SIGHUP in received:
        quiet_stdout()
    if signal.SIGHUP in old_handlers:
        signal.signal(signal.SIGHUP, old_handlers[signal.SIGHUP])
    status = 128 + received[0] if received else EXIT_SIGINT  # Ctrl-C without a handler: 130
    return (status if interrupted else 0), data
