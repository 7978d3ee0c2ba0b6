"""Small statistics used across the reports and the live views, each defined once."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); p50 is the median."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def theil_sen_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Median of the pairwise slopes: a straight-line fit that a few outliers do not move."""
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i])
              for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[j] != xs[i]]
    return statistics.median(slopes) if slopes else 0.0


def least_squares(rows: list[list[float]], ys: list[float]) -> list[float]:
    """The coefficients that fit ``ys`` from ``rows`` best, each column scaled first (columns
    of 1, ~10³ and ~10⁵, as memtop fit's 1, B·T and B·T², stay well conditioned)."""
    import numpy as np

    a = np.asarray(rows, dtype=float)
    scale = np.maximum(np.abs(a).max(axis=0), 1.0)
    coef, *_ = np.linalg.lstsq(a / scale, np.asarray(ys, dtype=float), rcond=None)
    return [float(c) for c in coef / scale]


def matrix_rank(rows: list[list[float]]) -> int:
    """The rank of ``rows`` with the same column scaling: below its columns, a fit on them
    would be underdetermined."""
    import numpy as np

    a = np.asarray(rows, dtype=float)
    return int(np.linalg.matrix_rank(a / np.maximum(np.abs(a).max(axis=0), 1.0)))


# building ----------------------------------------------------------------------------------------


def band(values: list[float]) -> dict[str, Any] | None:
    """Median with its p25-p75 band; None without values."""
    if not values:
        return None
    return {"median": percentile(values, 50), "p25": percentile(values, 25),
            "p75": percentile(values, 75), "n": len(values)}
