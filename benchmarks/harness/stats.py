"""The figures' arithmetic: medians, quartiles and percentiles, the A/A noise band and the verdict
a ratio gets against its target, and the one table format every ratio benchmark prints.

On a shared 2-core machine one run differs from the next by ±5% or more, so a 1-2% target cannot
be judged from a handful of A-then-B repeats: a ratio is judged only when its target lies outside
the band that the same run's A/A noise explains (benchmarks/README.md, "Ratio benchmarks").
"""

from __future__ import annotations

import math
import statistics

MIN_PAIRS = 7  # fewer pairs: the figures are printed but never judged


def median(values: list[float]) -> float:
    return statistics.median(values)


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(Q1, median, Q3), inclusive method (well defined from 2 values on)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); nan for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))
    return s[k]


def spread(values: list[float], fmt: str = "{:.3f}", unit: str = "", bold: bool = True) -> str:
    """A figure as the tables give it: the median, its IQR and min–max (n/a for none)."""
    if not values:
        return "n/a"
    q1, med, q3 = quartiles(values)
    mid = fmt.format(med) + unit
    return (f"{'**' + mid + '**' if bold else mid} (IQR {fmt.format(q1)}–{fmt.format(q3)}{unit}, "
            f"min–max {fmt.format(min(values))}–{fmt.format(max(values))}{unit}, "
            f"n={len(values)})")


def noise_band(aa: list[float], pairs: int) -> float:
    """Half-width of the band around a median ratio of ``pairs`` pairs that noise alone
    explains (see verdict)."""
    q1, _, q3 = quartiles(aa)
    return 1.3 * (q3 - q1) / math.sqrt(max(1, pairs))


def verdict(ratio_median: float, aa: list[float], target: float, pairs: int,
            others_cores: float, max_busy: float, higher_is_better: bool = True) -> str:
    """met / missed / inside noise (cannot tell); never a verdict from < MIN_PAIRS pairs or
    from runs other processes disturbed.

    Noise band around the median ratio: 1.3 × the A/A interquartile range / √pairs. The median
    of n pairs has a standard error of about 0.93 × IQR / √n (normal noise: IQR = 1.35 σ,
    SE(median) = 1.25 σ / √n), so the band is ~1.4 standard errors: half the A/A IQR at 7
    pairs, narrower with more pairs. A target inside it cannot be told apart from noise."""
    if pairs < MIN_PAIRS:
        return f"not judged ({pairs} pairs < {MIN_PAIRS})"
    if others_cores > max_busy:
        return f"not judged (under load: others used {others_cores:.2f} cores)"
    half = noise_band(aa, pairs)
    if abs(ratio_median - target) <= half:
        return "inside noise (cannot tell)"
    ok = ratio_median >= target if higher_is_better else ratio_median <= target
    return "met" if ok else "missed"


def met(value: float, target: float, higher_is_better: bool = False) -> str:
    """A plain figure against its target: met / missed (n/a for nan)."""
    if value != value:
        return "n/a"
    ok = value >= target if higher_is_better else value <= target
    return "met" if ok else "missed"


def md_table(head: list[str], rows: list[list[object]]) -> str:
    """A markdown table: the head, its rule, one line per row."""
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                      *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)])


RATIO_HEADER = ("| comparison | pairs | median ratio | min–max | IQR (Q1–Q3) | A/A median | "
                "A/A min–max | A/A IQR | noise band | target | verdict |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|")


def ratio_row(name: str, ratios: list[float], aa: list[float], target: float,
              others_cores: float, max_busy: float,
              higher_is_better: bool = True) -> tuple[str, str]:
    """One row of RATIO_HEADER's table, and its verdict."""
    q1, med, q3 = quartiles(ratios)
    a1, amed, a3 = quartiles(aa)
    v = verdict(med, aa, target, len(ratios), others_cores, max_busy, higher_is_better)
    sign = "≥" if higher_is_better else "≤"
    row = (f"| {name} | {len(ratios)} | **{med:.3f}** | {min(ratios):.3f}–{max(ratios):.3f} | "
           f"{q1:.3f}–{q3:.3f} | {amed:.3f} | {min(aa):.3f}–{max(aa):.3f} | {a1:.3f}–{a3:.3f} | "
           f"±{noise_band(aa, len(ratios)):.3f} | {sign} {target:g} | {v} |")
    return row, v


def ratio_value(ratios: list[float], aa: list[float]) -> str:
    """A ratio as RESULTS.md's table gives it: the median, its IQR and the A/A noise band."""
    q1, med, q3 = quartiles(ratios)
    return f"{med:.3f} (IQR {q1:.3f}–{q3:.3f}; noise band ±{noise_band(aa, len(ratios)):.3f})"
