"""Several ranks in one run folder, read back: how each rank ended, which one brought the run
down and why, and the spread of a value across ranks (min / median / max).

Used by the launcher (`memtop train --nproc N`), the report and `memtop runs`. Reads only the
files (metrics-rank-K.jsonl, and torchrun.log when memtop launched the ranks).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from probes.runfolder import TORCHRUN_LOG, metrics_files, read_rows

# torch.distributed.elastic's failure table (torch/distributed/elastic/multiprocessing/errors)
_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)"
                      r"[^\n]*\n(?:[^\n]*\n)*?\s*traceback\s*:\s*([^\n]*)")
# what a rank's collective raises once a peer has gone: a consequence, not a cause
_PEER_GONE = re.compile(r"connection (closed|reset)|broken pipe|peer|gloo|nccl|timed? ?out|"
                        r"socket", re.IGNORECASE)


@dataclass(frozen=True)
class RankEnd:
    """How one rank's metrics file ends."""

    rank: int
    steps: int  # step rows written
    last_step: int
    finished: str | None  # run_finished's reason; None when the rank never wrote it
    error: str | None  # "Type: message" of its error row
    error_step: int | None
    pid: int | None
    unreadable: int  # lines that are not a valid row (a cut last line included)
    guard_step: int | None = None  # the step at which --max-memory's guard stopped this rank

    @property
    def ok(self) -> bool:
        return self.finished is not None and self.error is None


@dataclass(frozen=True)
class ProcessExit:
    """What torchrun's agent said about one failed rank process."""

    rank: int
    exitcode: int
    message: str  # e.g. "Signal 9 (SIGKILL) received by PID 123"


def rank_ends(run_dir: Path) -> list[RankEnd]:
    """Every rank's file read to its end (a lone metrics.jsonl is rank 0)."""
    out = []
    for rank, path in metrics_files(Path(run_dir)).items():
        try:
            rows = read_rows(path)
        except ValueError:
            continue
        steps = rows.steps
        finished = error = None
        error_step = pid = guard_step = None
        for e in rows.events:
            if e["event"] == "run_finished":
                finished = str(e.get("reason") or "finished")
            elif e["event"] == "error":
                error = f"{e.get('error_type', 'Error')}: {e.get('message', '')}"
                error_step = e.get("step")
            elif e["event"] == "run_started" and isinstance(e.get("pid"), int):
                pid = e["pid"]
            elif e["event"] == "memory_guard":
                guard_step = e.get("step")
        out.append(RankEnd(rank or 0, len(steps), max((r["step"] for r in steps), default=0),
                           finished, error, error_step, pid, rows.bad, guard_step))
    return out


def process_exits(log_text: str) -> dict[int, ProcessExit]:
    """rank -> exit code and message, from torchrun's failure table (empty when none)."""
    out: dict[int, ProcessExit] = {}
    for m in _FAILURE.finditer(log_text):
        rank = int(m.group(1))
        out.setdefault(rank, ProcessExit(rank, int(m.group(2)), m.group(3).strip()))
    return out


def read_process_exits(run_dir: Path) -> dict[int, ProcessExit]:
    try:
        text = (Path(run_dir) / TORCHRUN_LOG).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    return process_exits(text)


def failed_rank(ends: Sequence[RankEnd], exits: dict[int, ProcessExit]) -> RankEnd | None:
    """The rank that brought the run down: one that died without a word (killed) before one
    that raised, and one that raised before one whose collective failed because a peer went."""
    bad = [e for e in ends if not e.ok]
    if not bad:
        return None

    def order(e: RankEnd) -> tuple[int, int, int]:
        if e.error is None:
            kind = 0  # no error row, no run_finished: killed
        elif not _PEER_GONE.search(e.error):
            kind = 1
        else:
            kind = 2
        # among ranks killed alike (a survivor stuck in a collective is killed by torchrun
        # after its grace period, also without a word) the one that stopped first: the
        # other went on to the step after
        return kind, e.last_step, e.rank
    return min(bad, key=order)


def failure_text(ends: Sequence[RankEnd], exits: dict[int, ProcessExit]) -> str | None:
    """One sentence: which rank failed and why; None when every rank ended cleanly."""
    culprit = failed_rank(ends, exits)
    if culprit is None:
        return None
    r = culprit.rank
    if culprit.error is not None:
        text = f"rank {r} failed at step {culprit.error_step}: {culprit.error}"
    else:
        ex = exits.get(r)
        how = (ex.message if ex and ex.exitcode < 0 else
               f"exit code {ex.exitcode}" if ex else "killed, or its process died")
        text = f"rank {r} ended without finishing after step {culprit.last_step} ({how})"
    others = [e.rank for e in ends if not e.ok and e.rank != r]
    if others:
        text += "; then " + ", ".join(f"rank {o}" for o in others) + " stopped with it"
    return text


def spread(values: Sequence[float | int | None]) -> tuple[float, float, float] | None:
    """(min, median, max) of the known values; None when none is known."""
    known = [float(v) for v in values if v is not None]
    if not known:
        return None
    return min(known), statistics.median(known), max(known)
