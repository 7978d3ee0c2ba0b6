"""Several ranks in one run folder, read back: how each rank ended, which one brought the run
down and why, the spread of a value across ranks (min / median / max), and the slowest rank.

Used by the launcher (`memtop train --nproc N`), the report, the rank table and `memtop runs`.
Reads only the files (metrics-rank-K.jsonl, and torchrun.log when memtop launched the ranks).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probes.analysis.step_split import phase_excess, phase_medians, row_split
from probes.records import SPLIT_LABELS
from probes.runfolder import TORCHRUN_LOG, metrics_files, read_rows
from probes.tools.stats import percentile
from probes.tools.units import format_ms

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


# A rank is the straggler when it loses at least this share of the median step cycle (data
# wait + step) against the other ranks; below it the ranks are even: step-to-step noise on a
# busy host is a few percent, and a +0.1% "slowest rank" sent users hunting for nothing.
STRAGGLER_SHARE = 0.05
NO_STRAGGLER = f"no straggler: no rank loses {STRAGGLER_SHARE:.0%} of a step against the others"


@dataclass(frozen=True)
class Slowest:
    """The rank the others wait for: its time beyond the other ranks' median, and where.

    Under DistributedDataParallel every rank waits for the slowest one inside its backward
    (the gradient all-reduce), so the waiting ranks' steps are the *long* ones; the rank they
    wait for is found from the phases (``phase_excess``: the rank and phase, backward last),
    and from step times alone only when no row has the split."""

    rank: int
    excess_ms: float  # its phase (or step) median less the other ranks' median
    cycle_ms: float  # the median step cycle across ranks, data wait included
    phase: str | None  # the phase it loses the time in; None: rows without the step split

    @property
    def share(self) -> float:
        return self.excess_ms / self.cycle_ms

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "excess_ms": self.excess_ms, "cycle_ms": self.cycle_ms,
                "share": self.share, "phase": self.phase, "text": slowest_text(self)}


def _cycle_ms(row: Mapping[str, Any] | Any) -> float | None:
    step = row.get("step_ms") if isinstance(row, Mapping) else getattr(row, "step_ms", None)
    if not isinstance(step, (int, float)) or isinstance(step, bool):
        return None
    return float(step) + (row_split(row)["data_wait_ms"] or 0.0)


def slowest_rank(rows_by_rank: Mapping[int, Iterable[Mapping[str, Any] | Any]]) \
        -> Slowest | None:
    """The one definition of the slowest rank (the rank table, the view and the report): the
    rank the others wait for, when it loses ``STRAGGLER_SHARE`` of a step or more; None when
    the ranks are even (or fewer than two have steps). Rows: each rank's step rows (dicts or
    StepSamples), measured ones for the report, the recent ones for the live table."""
    rows = {rank: list(r) for rank, r in rows_by_rank.items()}
    cycles = {rank: percentile([c for c in map(_cycle_ms, r) if c is not None], 50)
              for rank, r in rows.items()}
    known = {rank: c for rank, c in cycles.items() if c is not None}
    if len(known) < 2:
        return None
    cycle = statistics.median(known.values())
    found = phase_excess({rank: phase_medians(r) for rank, r in rows.items() if rank in known})
    if found is not None:
        rank, phase, excess = found
    else:  # no step split in the rows: the step times are all there is
        rank = max(known, key=lambda k: known[k])
        phase, excess = None, known[rank] - statistics.median(
            [c for k, c in known.items() if k != rank])
    if cycle <= 0 or excess < STRAGGLER_SHARE * cycle:
        return None
    return Slowest(rank, excess, cycle, phase)


def slowest_text(slowest: Slowest | None) -> str:
    """One line, the same on every screen and in the report (≤ 78 columns)."""
    if slowest is None:
        return NO_STRAGGLER
    where = f"in {SPLIT_LABELS[slowest.phase]}" if slowest.phase else "per step"
    return (f"slowest: rank {slowest.rank}, +{format_ms(slowest.excess_ms)} {where} "
            f"({slowest.share:.0%} of a step); others wait for it")
