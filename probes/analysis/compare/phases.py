"""Which phase of the step a change moved (issue 26): each phase's median in A and B
(probes/analysis/step_split.py), B over A with the same noise rule as the step time, and the
phase whose median moved most among those the noise rule calls measurable.

Data wait counts too: a change of the loader (workers, pin_memory) moves only that phase, and
the step time (the ``with`` block) would not show it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from probes.records import SPLIT_FIELDS, SPLIT_LABELS
from probes.tools.units import format_ms

Ratio = Callable[[list[float], list[float]], dict[str, Any] | None]
# a phase must move at least this share of A's step (the sum of its phase medians) to be named:
# a 0.01 ms data wait 11% shorter is measurable by the noise rule, and no change's doing
MIN_MOVE_SHARE = 0.01


def phase_changes(a: Mapping[str, list[float]], b: Mapping[str, list[float]],
                  median_ratio: Ratio) -> dict[str, Any] | None:
    """Per phase: medians, their ratio (``median_ratio``'s noise rule) and the ms it moved;
    ``moved``: the measurable phase that moved most, by at least MIN_MOVE_SHARE of A's step
    (None when none did). None when either
    run has no split (it predates issue 26, or the phase was never seen)."""
    per: dict[str, Any] = {}
    for name in SPLIT_FIELDS:
        change = median_ratio(list(a.get(name, [])), list(b.get(name, [])))
        if change is not None:
            per[name] = {**change, "delta_ms": change["b"] - change["a"]}
    if not per:
        return None
    floor_ms = MIN_MOVE_SHARE * sum(c["a"] for c in per.values())
    measurable = [(abs(c["delta_ms"]), name) for name, c in per.items()
                  if c["measurable"] and abs(c["delta_ms"]) >= floor_ms]
    return {"phases": per, "moved": max(measurable)[1] if measurable else None}


def phase_lines(p: Mapping[str, Any] | None) -> list[str]:
    """compare.md's lines: each phase A -> B, then which one the change moved."""
    if p is None:
        return ["- Step split: n/a (a run has no phases: it predates the split, or no hook saw "
                "them)"]
    parts = []
    for name, c in p["phases"].items():
        mark = "" if c["measurable"] else " (noise)"
        parts.append(f"{SPLIT_LABELS[name]} {format_ms(c['a'])} -> {format_ms(c['b'])} "
                     f"({c['delta_ms']:+.2f} ms{mark})")
    out = ["- Step split (medians): " + "; ".join(parts)]
    moved = p["moved"]
    if moved is None:
        out.append(f"- The change moved no phase measurably (by {MIN_MOVE_SHARE:.0%} of the step "
                   "or more)")
    else:
        c = p["phases"][moved]
        out.append(f"- The change moved {SPLIT_LABELS[moved]} most: {c['delta_ms']:+.2f} ms "
                   f"({c['ratio']:.3f}x)")
    return out
