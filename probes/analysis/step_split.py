"""Where the steps went, read from step rows (torch-free; every reader uses it: the step-split
pane, the headless line, the rank table, the report's "Where the step went", ``memtop compare``).

A row's split (probes/instruments/phases.py writes it): ``data_wait_ms`` (the loop's own time
before the step: loader, logging) and, inside the step, ``forward_ms``, ``backward_ms``,
``optimizer_ms`` and ``other_ms`` (the step less the three: loss, zero_grad, memtop's reads).
A phase no hook saw is None; a row written before the split existed has no such key at all,
which is how a reader tells "the run predates the split" from "a phase was not seen".

    from probes.analysis.step_split import phase_stats, split_line, why_no_split
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from probes.records import SPLIT_FIELDS, SPLIT_LABELS
from probes.tools.stats import percentile
from probes.tools.units import format_ms

SHORT = {"data_wait_ms": "wait", "forward_ms": "fwd", "backward_ms": "bwd",
         "optimizer_ms": "opt", "other_ms": "other"}  # the headless line's and the bar's words
PREDATES = "the run predates the step split (no phase fields in its rows)"
WHY_NONE = {  # why a phase is null on every row that has the split
    "data_wait_ms": "no data wait: each step's start followed a pause or the run's start",
    "forward_ms": "no forward seen: the model was not called inside the step, or a compiled "
                  "function fused it",
    "backward_ms": "no backward seen: no gradient reached the model's outputs inside the step",
    "optimizer_ms": "no optimizer step seen: its step hooks did not fire (a skipped "
                    "GradScaler step, or an optimizer without them)",
    "other_ms": "no step end seen",
}


def has_split(row: Mapping[str, Any]) -> bool:
    """The row was written by a memtop that records the split (its keys exist, maybe null)."""
    return "data_wait_ms" in row


def row_split(row: Mapping[str, Any] | Any) -> dict[str, float | None]:
    """The five phase fields of a row (a dict or a StepSample), None where missing."""
    get = row.get if isinstance(row, Mapping) else (lambda name: getattr(row, name, None))
    return {name: _num(get(name)) for name in SPLIT_FIELDS}


def phase_values(rows: Iterable[Mapping[str, Any] | Any]) -> dict[str, list[float]]:
    """Each phase's recorded values over ``rows`` (nulls left out)."""
    out: dict[str, list[float]] = {name: [] for name in SPLIT_FIELDS}
    for row in rows:
        for name, value in row_split(row).items():
            if value is not None:
                out[name].append(value)
    return out


def phase_medians(rows: Iterable[Mapping[str, Any] | Any]) -> dict[str, float | None]:
    """The median of each phase over ``rows`` (None: never seen)."""
    return {name: percentile(vals, 50) for name, vals in phase_values(rows).items()}


def phase_stats(rows: Iterable[Mapping[str, Any] | Any]) -> dict[str, dict[str, Any]]:
    """Median, p95, the number of rows that saw it, and the share of the median cycle, per phase
    (the cycle: data wait plus the step's parts, the time a step costs the loop)."""
    values = phase_values(rows)
    medians = {name: percentile(vals, 50) for name, vals in values.items()}
    total = sum(m for m in medians.values() if m is not None)
    return {name: {"median_ms": medians[name], "p95_ms": percentile(vals, 95), "n": len(vals),
                   "share": medians[name] / total if medians[name] is not None and total else None}
            for name, vals in values.items()}


def shares(split: Mapping[str, float | None]) -> dict[str, float | None]:
    """Each phase's share of the phases seen (None where unseen)."""
    total = sum(v for v in split.values() if v is not None)
    return {name: (v / total if v is not None and total > 0 else None)
            for name, v in split.items()}


def largest_phase(split: Mapping[str, float | None]) -> str | None:
    seen = [(v, name) for name, v in split.items() if v is not None]
    return max(seen)[1] if seen else None


def split_line(row: Mapping[str, Any] | Any) -> str | None:
    """The headless line under a step (≤ 80 columns): its phases in ms, or None without any."""
    split = row_split(row)
    if all(v is None for v in split.values()):
        return None
    parts = "  ".join(f"{SHORT[name]} {format_ms(v)}" for name, v in split.items())
    return f"  split  {parts}"


def why_no_split(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Phase -> why it is null on every row (PREDATES when no row has the fields); phases seen
    on some row are left out."""
    if not rows or not any(has_split(r) for r in rows):
        return dict.fromkeys(SPLIT_FIELDS, PREDATES)
    values = phase_values(r for r in rows if has_split(r))
    return {name: WHY_NONE[name] for name, vals in values.items() if not vals}


def phase_excess(rank_medians: Mapping[int, Mapping[str, float | None]]) \
        -> tuple[int, str, float] | None:
    """The rank and phase that lose most time against the median of the other ranks, and by
    how many ms (the straggler line: "rank 1: +38 ms in data wait"); None without two ranks'
    phases. Under DistributedDataParallel the other ranks wait for a slow rank inside their
    backward (the gradient all-reduce), so an excess in backward is only named when no other
    phase has one: it is where a straggler's time shows up on the others, not its cause."""
    found: list[tuple[float, int, str]] = []
    for rank, mine in rank_medians.items():
        others = [m for r, m in rank_medians.items() if r != rank]
        for name in SPLIT_FIELDS:
            theirs = [m[name] for m in others if m.get(name) is not None]
            value = mine.get(name)
            if value is not None and theirs:
                found.append((value - percentile(theirs, 50), rank, name))  # type: ignore[operator]
    if not found:
        return None
    causes = [f for f in found if f[2] != "backward_ms" and f[0] > 0]
    excess, rank, name = max(causes or found)
    return rank, name, excess


def excess_text(excess: tuple[int, str, float] | None) -> str | None:
    if excess is None:
        return None
    rank, name, ms = excess
    return f"rank {rank}: {ms:+.0f} ms in {SPLIT_LABELS[name]}"


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None
