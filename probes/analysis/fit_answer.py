"""The answer `memtop fit` gives from a fit (probes/analysis/fit.py): the largest B at today's
T and the largest T at today's B under budget × (1 − headroom), the predicted peak of each, a
range instead of one number where the fit is poor, the first size predicted over the whole
budget (what --verify runs to see it stopped), and which parts move the limit most.

No torch; pure functions of the fit's dict (tested in tests/unit/test_fit_math.py).
"""

from __future__ import annotations

import math
from typing import Any

from probes.analysis.fit import (
    GOOD_FIT,
    SCORES_ADVICE,
    band_at,
    largest_batch,
    largest_seq,
    parts_for,
    predict,
)

MOVES_SHOWN = 3  # parts named under "moves the limit most"


def limit_bytes(budget_bytes: int, headroom_pct: float) -> int:
    """What the largest sizes must stay under: the budget less its headroom."""
    return int(budget_bytes * (1.0 - headroom_pct / 100.0))


def answer(fit: dict[str, Any], budget_bytes: int, headroom_pct: float, batch_size: int,
           seq_len: int, max_seq_len: int | None = None) -> dict[str, Any]:
    """The largest B at T=``seq_len``, the largest T at B=``batch_size`` (at most
    ``max_seq_len``, the model's context), their predicted peaks, and what moves the limit."""
    limit = limit_bytes(budget_bytes, headroom_pct)
    today = predict(fit, batch_size, seq_len)
    today["fits"] = today["peak_bytes"] <= limit
    out: dict[str, Any] = {"budget_bytes": budget_bytes, "headroom_pct": headroom_pct,
                           "limit_bytes": limit, "band": float(fit["band"]),
                           "poor": bool(fit["poor"]),
                           "today": today}
    out["batch"] = _batch(fit, seq_len, limit, budget_bytes) if fit["batch_varied"] \
        else {"seq_len": seq_len, "largest": None,
              "why": f"B was held at {batch_size} (--vary context)"}
    out["context"] = _context(fit, batch_size, limit, budget_bytes, max_seq_len) \
        if fit["seq_varied"] else {"batch_size": batch_size, "largest": None,
                                   "why": f"T was held at {seq_len} (--vary batch)"}
    at_b = out["batch"].get("largest") or batch_size
    out["moves"] = moves(fit, at_b, seq_len)
    return out


def _batch(fit: dict[str, Any], t: int, limit: int, budget: int) -> dict[str, Any]:
    best = largest_batch(fit, t, limit)
    if best is None:
        return {"seq_len": t, "largest": None, "why": "the fit sees no growth with B: the "
                "points are noisier than their sizes differ"}
    band = band_at(fit, max(best, 1), t)
    over = (largest_batch(fit, t, budget) or 0) + 1  # the first B predicted over the budget
    out: dict[str, Any] = {"seq_len": t, "largest": best, "band": band,
                           "range": band > GOOD_FIT,
                           "low": largest_batch(fit, t, limit / (1 + band)),
                           "high": largest_batch(fit, t, limit / (1 - band)) if band < 1
                           else None,
                           "over": over, "over_peak_bytes": predict(fit, over, t)["peak_bytes"]}
    if best >= 1:
        p = predict(fit, best, t)
        out.update(peak_bytes=p["peak_bytes"], counter_peak_bytes=p["counter_peak_bytes"])
    else:
        out["why"] = (f"even B=1 is predicted at "
                      f"{predict(fit, 1, t)['peak_bytes']} bytes, over the limit")
    return out


def _context(fit: dict[str, Any], b: int, limit: int, budget: int,
             max_t: int | None) -> dict[str, Any]:
    cap = max_t if max_t is not None else math.inf
    allows = largest_seq(fit, b, limit)
    best = int(min(math.floor(allows), cap)) if math.isfinite(min(allows, cap)) else None
    band = band_at(fit, b, max(best or 1, 1))

    def capped(x: float) -> int | None:
        return int(min(math.floor(x), cap)) if math.isfinite(min(x, cap)) else None

    out: dict[str, Any] = {"batch_size": b, "largest": best, "band": band,
                           "range": band > GOOD_FIT,
                           "memory_allows": None if math.isinf(allows) else int(allows),
                           "capped_by_context": max_t is not None and allows > max_t,
                           "max_seq_len": max_t,
                           "low": capped(largest_seq(fit, b, limit / (1 + band))),
                           "high": capped(largest_seq(fit, b, limit / (1 - band)))
                           if band < 1 else None}
    whole = largest_seq(fit, b, budget)
    if math.isfinite(whole) and whole + 1 <= cap:  # the first T over the whole budget
        over = math.floor(whole) + 1
        out.update(over=over, over_peak_bytes=predict(fit, b, over)["peak_bytes"])
    else:
        out["over"] = None  # the model's context ends first
    if best:
        p = predict(fit, b, best)
        out.update(peak_bytes=p["peak_bytes"], counter_peak_bytes=p["counter_peak_bytes"])
    else:
        out["why"] = "even T=1 is predicted over the limit" if best == 0 else \
            "the fit sees no growth with T"
    return out


def moves(fit: dict[str, Any], b: int, t: int) -> list[dict[str, Any]]:
    """The parts with the largest shares of the predicted peak at (B, T), with what moves
    each; T×T scores, where measured, named beside the activations that hold them."""
    p = predict(fit, b, t)
    total = p["peak_bytes"] or 1
    advice = {s.name: s.advice for s in parts_for(fit["device"])}
    ranked = sorted(p["parts"].items(), key=lambda kv: kv[1], reverse=True)
    out = []
    for name, value in ranked[:MOVES_SHOWN]:
        entry = {"part": name, "bytes": value, "share": value / total,
                 "advice": advice.get(name, "")}
        if name == "saved activations" and p.get("scores_bytes"):
            entry["scores_share"] = p["scores_bytes"] / total
            entry["scores_advice"] = SCORES_ADVICE
        out.append(entry)
    return out


REFINE_REACH = 4.0  # an answer this far past the probe's largest size gets a point between


def refine_points(fit: dict[str, Any], ans: dict[str, Any]) -> list[tuple[int, int]]:
    """One more probe point per axis where the answer lies far past the probed sizes: at the
    geometric middle between the largest probed size and the answer (B at today's T, T at the
    context points' B), so the fit is checked, and its extrapolation measured, nearer where
    the limit bites. Glibc's free pages during backward grow faster than linearly with the
    step's size (the RSS peak of a 7× larger B measured 5% over a fit of B = 1, 2, 4)."""
    out = []
    batch, context = ans["batch"], ans["context"]
    best_b = batch.get("largest")
    t0 = batch.get("seq_len")
    probed_b = fit["batch_sizes"]
    if fit["batch_varied"] and best_b and best_b > REFINE_REACH * max(probed_b):
        out.append((round(math.sqrt(max(probed_b) * best_b)), t0))
    best_t = context.get("largest")
    if fit["seq_varied"] and best_t and best_t > 2 * max(fit["seq_lens"]):
        b = context["batch_size"]
        out.append((b, round(math.sqrt(max(fit["seq_lens"]) * best_t))))
    return [p for p in dict.fromkeys(out) if p[0] >= 1 and p[1] >= 1]
