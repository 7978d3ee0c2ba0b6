"""``memtop runs [FOLDER]``: one line per run, newest last, to find the run to view."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from trainer.config import TrainConfig
from tui.commands.argtypes import EXIT_USAGE, default_of

if TYPE_CHECKING:
    from probes.analysis.runlist import RunSummary


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="list the runs in a folder: state, steps, device, peak",
                       description="One line per run folder: id, state (live, finished, "
                                   "stopped, interrupted, failed), steps, device, amp, "
                                   "throughput (the report's p50 over measured steps; a live "
                                   "run: its last 512 steps) and peak memory. A run's id "
                                   "is its start time.")
    p.add_argument("folder", metavar="FOLDER", nargs="?", default=DEFAULT_FOLDER,
                   help="a folder of runs (default: %(default)s)")


NAME_WIDTH = 22  # a run id: <YYYYmmdd-HHMMSS>-<6 hex>, so it says when the run started


def format_row(s: RunSummary, name: str | None = None, width: int = NAME_WIDTH) -> str:
    """One run's line under header(width)'s columns, ≤ 80 columns for a run id;
    ``name`` for a run one folder deeper (fp32/<id>)."""
    from probes.tools.units import format_bytes, format_rate

    rate = f"{format_rate(s.throughput)} {s.throughput_unit}" if s.throughput else "n/a"
    device = (s.device or "n/a") + (f" x{s.ranks}" if s.ranks > 1 else "")
    return (f"{name or s.run_dir.name:<{width}} {s.outcome:<11} {s.steps:>7} {device:<8} "
            f"{s.amp or 'n/a':<4} {rate:>13} {format_bytes(s.peak_bytes):>9}")


DEFAULT_FOLDER = default_of(TrainConfig, "run_dir")  # where memtop train writes


def header(width: int = NAME_WIDTH) -> str:
    return (f"{'RUN':<{width}} {'STATE':<11} {'STEPS':>7} {'DEVICE':<8} {'AMP':<4} "
            f"{'THROUGHPUT':>13} {'PEAK':>9}")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from probes.analysis.runlist import summarize_run
    from probes.runfolder import find_runs, is_run_folder

    root = Path(args.folder)
    if not root.is_dir():
        where = root.resolve()
        what = "is not a folder" if root.exists() else "does not exist"
        hint = (" (memtop train writes its runs there, in the folder it was started from)"
                if args.folder == DEFAULT_FOLDER else "")
        print(f"memtop runs: {where} {what}{hint}; point it at a folder of runs: "
              "`memtop runs DIR`", file=sys.stderr)
        return EXIT_USAGE
    runs = [root] if is_run_folder(root) else find_runs(root)
    if not runs:
        print(f"memtop: no runs in {root} (start one with `memtop train`)")
        return 0
    names = [str(path.relative_to(root)) if path != root else path.name for path in runs]
    width = max(NAME_WIDTH, *(len(n) for n in names))
    print(header(width))
    for path, name in zip(runs, names, strict=True):
        summary = summarize_run(path)
        line = format_row(summary, name, width)
        if summary.reason and summary.outcome in ("failed", "stopped", "interrupted",
                                                  "incomplete"):
            line += f"  {summary.reason}"
        print(line)
    return 0
