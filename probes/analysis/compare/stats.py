"""The statistics `memtop compare` judges with: a median ratio with a bootstrap band, its verdict
in words, and whether two loss curves agree (probes/analysis/compare/compare.py states the
rules in its result). Pure, no torch."""

from __future__ import annotations

import math
from typing import Any

from probes.analysis.compare.windows import DEFAULT_LOSS_TOLERANCE
from probes.analysis.measured import LOSS_WINDOW

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_MAX_ROWS = 5000  # longer runs are thinned evenly before resampling


def _thin(values: list[float]) -> Any:
    import numpy as np

    arr = np.asarray(values, dtype=float)
    if arr.size > BOOTSTRAP_MAX_ROWS:
        arr = arr[np.linspace(0, arr.size - 1, BOOTSTRAP_MAX_ROWS).astype(int)]
    return arr


def median_ratio(a: list[float], b: list[float], seed: int = 0) -> dict[str, Any] | None:
    """b's median over a's, with a 95% bootstrap interval. Measurable only when both noise
    views agree: the interval excludes 1 and b's median lies outside a's p25-p75 band (the
    within-run bootstrap alone is too narrow: step times drift with the machine's load)."""
    import numpy as np

    if len(a) < 2 or len(b) < 2:
        return None
    xa, xb = _thin(a), _thin(b)
    ma, mb = float(np.median(xa)), float(np.median(xb))
    if ma <= 0:
        return None
    rng = np.random.default_rng(seed)
    ra = np.median(xa[rng.integers(0, xa.size, (BOOTSTRAP_RESAMPLES, xa.size))], axis=1)
    rb = np.median(xb[rng.integers(0, xb.size, (BOOTSTRAP_RESAMPLES, xb.size))], axis=1)
    ratios = rb / np.where(ra > 0, ra, np.nan)
    lo, hi = (float(x) for x in np.nanpercentile(ratios, [2.5, 97.5]))
    p25, p75 = (float(x) for x in np.percentile(xa, [25, 75]))
    outside = not (p25 <= mb <= p75)
    return {"a": ma, "b": mb, "ratio": mb / ma, "low": lo, "high": hi,
            "outside_band": outside, "measurable": outside and not (lo <= 1.0 <= hi)}


def speed_verdict(change: dict[str, Any] | None, higher_is_better: bool = True) -> str:
    """'1.830x the baseline, faster (95% interval 1.79-1.88)' or 'no measurable difference: ...'.

    ``change`` is B over A (median_ratio); ``higher_is_better`` says which way is faster.
    """
    if change is None:
        return "n/a (too few measured steps)"
    r, lo, hi = change["ratio"], change["low"], change["high"]
    text = f"{r:.3f}x the baseline (95% interval {lo:.3f}-{hi:.3f})"
    if not change["measurable"]:
        return "no measurable difference: " + text
    faster = (r > 1) == higher_is_better
    return text + (", faster" if faster else ", slower")


def _smoothed(losses: dict[int, float], steps: list[int], window: int) -> list[float]:
    vals = [losses[s] for s in steps]
    out, total = [], 0.0
    for i, v in enumerate(vals):
        total += v
        if i >= window:
            total -= vals[i - window]
        out.append(total / min(i + 1, window))
    return out


def loss_agreement(a: dict[int, float], b: dict[int, float],
                   tolerance: float = DEFAULT_LOSS_TOLERANCE,
                   window: int = LOSS_WINDOW) -> dict[str, Any]:
    """§6.2: the loss curves, each a trailing ``window``-step mean, agree within ``tolerance``
    (relative to the first run) over the common steps; where they part if they do.

    Per-step equality is not asked for: the order of floating-point operations differs between
    precisions; the trend and the final value are what must hold.
    """
    common = sorted(set(a) & set(b))
    out: dict[str, Any] = {"tolerance": tolerance, "window": window, "common_steps": len(common),
                           "agree": None, "parted_at_step": None, "max_rel_diff": None,
                           "final_rel_diff": None}
    if not common:
        return out
    sa, sb = _smoothed(a, common, window), _smoothed(b, common, window)
    diffs = [abs(y - x) / abs(x) if x else math.inf for x, y in zip(sa, sb, strict=True)]
    parted = next((common[i] for i, d in enumerate(diffs) if d > tolerance), None)
    out.update(agree=parted is None, parted_at_step=parted, max_rel_diff=max(diffs),
               final_rel_diff=diffs[-1], final_a=sa[-1], final_b=sb[-1])
    if parted is not None:
        i = common.index(parted)
        out.update(loss_a_at_part=sa[i], loss_b_at_part=sb[i])
    return out


def decreasing(losses: dict[int, float], window: int = LOSS_WINDOW) -> bool | None:
    steps = sorted(losses)
    if len(steps) < 2 * window:
        return None
    first = sum(losses[s] for s in steps[:window]) / window
    last = sum(losses[s] for s in steps[-window:]) / window
    return last < first


# ---- the comparison ----------------------------------------------------------------------------
