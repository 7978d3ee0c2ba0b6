"""Will it fit? The largest batch (B) and context (T) that fit a memory budget, predicted by
parts from a few measured probe points (`memtop fit`, README "Will it fit?").

A probe point is a few steps at one (B, T) measured to steady state (trainer/fitmeter.py). Its
peak is split into parts (PARTS: what each is, per device), every part a measured figure:

- rest parts (parameters, optimizer state, the runtime's own memory) are what a step leaves
  behind; they do not depend on B or T. Taken from the first probe point: a fresh run holds
  the one shape's caches it held (oneDNN builds kernels per shape under CPU bf16).
- step parts (gradients, autocast weight copies, saved activations, temporaries) are each
  fitted by least squares on 1, B·T and, where the run measured saved T×T attention scores
  (explicit attention; none with sdpa), B·T²;
- the allocator's or heap's overhead (CUDA: its cache; CPU: what backward adds above the end
  of forward and the free pages glibc keeps) follows the step's tensors: a constant plus a
  share of the saved activations and temporaries. Backward allocates their gradients, the same
  sizes, and glibc's free pages follow them: fitted on its own in B·T and B·T² over the
  probe's small sizes, it came out falling with T² and missed T = 1024 by 150 MiB; as a share
  (about half, measured at 4-8× past the probe) it extrapolates with them.

The prediction is their sum; residuals are measured minus predicted peak at the probe points.
The band (±) adds separate errors (band_at): the fit's own within the probe's process (the
largest of the residuals and each point's step-to-step spread), the run-to-run noise, and past
the probe's sizes the extrapolation's. Run to run: a point's two measured steps see one
process's rest level and heap layout, a fresh run its own (memtop's default CPU model, amp
off, at B = 24 measured 619-635 MiB in five fresh processes, each point's two steps within
0.4%), so `memtop fit` measures the probe's largest point again in a fresh process (role
FRESH, as --verify runs its sizes); how far it lies from the prediction, grown with the step's
part, is that term. The fresh point is not fitted (it would bend the fit towards one process);
it is predicted, as an answer is. Over GOOD_FIT the fit is poor. The extrapolation's: the error
of predicting the largest point from the others (leave-one-out: how the fit extrapolates,
measured) per doubling of B·T. Where the band passes GOOD_FIT the answer is a range, not one
number.

No torch: readers (`memtop report`, `compare`) load fit.json through this module. What is
measured before the fit (the budget's check, the probe's points) is probes/analysis/fit_plan.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from probes.tools.stats import least_squares, matrix_rank

FIT_VERSION = 1
FIT_FILE = "fit.json"
OK, OVER, OOM, GUARD, FAILED, INTERRUPTED, NOT_RUN = (
    "ok", "over budget", "oom", "guard", "failed", "interrupted", "not run")
GOOD_FIT = 0.05  # a band (residuals, spread, extrapolation) above this: the fit is poor
DEFAULT_HEADROOM_PCT = 10.0  # what `--headroom` leaves free of the budget by default
REST, STEP = "rest", "step"
FRESH = "fresh"  # a point's role: measured in a fresh process, the run-to-run check


class FitError(ValueError):
    """The points do not make a fit (too few, all at one size): the reason, one sentence."""


@dataclass(frozen=True)
class PartSpec:
    """One part of the peak: ``rest`` (constant) or ``step`` (fitted in B and T);
    ``in_counter``: part of the counter's own peak (CPU heap peak, CUDA peak allocated);
    ``follows``: an overhead fitted as a constant plus a share (≥ 0) of those parts, not on
    its own (module docstring)."""

    name: str
    kind: str
    in_counter: bool
    advice: str
    follows: tuple[str, ...] = ()


_ACTS = "activation checkpointing, or a smaller B or T"
_TENSORS = ("saved activations", "temporaries")  # what the overheads follow
PARTS: dict[str, tuple[PartSpec, ...]] = {
    "cpu": (
        PartSpec("parameters", REST, True, "bf16 parameters halve them; a smaller model"),
        PartSpec("optimizer state", REST, True,
                 "SGD with momentum keeps one copy where AdamW keeps two; 8-bit states"),
        PartSpec("runtime heap", REST, True,
                 "torch's and Python's own heap in this process, not the model's"),
        PartSpec("outside the heap", REST, False,
                 "libraries, code pages, Python's arenas: the process, not the model"),
        PartSpec("gradients", STEP, False, "one per parameter: bf16 parameters, sharding"),
        PartSpec("autocast weight copies", STEP, True, "bf16 casts of the weights per step"),
        PartSpec("saved activations", STEP, True, _ACTS),
        PartSpec("temporaries", STEP, True,
                 "logits and loss (B×T×vocab in fp32): a chunked loss"),
        PartSpec("backward and free heap", STEP, False,
                 "backward's buffers and the free pages glibc keeps: a smaller B or T",
                 follows=_TENSORS),
    ),
    "cuda": (
        PartSpec("parameters", REST, True, "bf16 parameters halve them; FSDP shards them"),
        PartSpec("optimizer state", REST, True,
                 "SGD with momentum keeps one copy where AdamW keeps two; 8-bit states, ZeRO"),
        PartSpec("runtime", REST, True, "buffers and workspaces left between steps"),
        PartSpec("gradients", STEP, True, "one per parameter: bf16 parameters, sharding"),
        PartSpec("autocast weight copies", STEP, True, "fp16/bf16 casts of the weights"),
        PartSpec("saved activations", STEP, True, _ACTS),
        PartSpec("temporaries", STEP, True,
                 "logits and loss (B×T×vocab in fp32), backward's buffers: a chunked loss"),
        PartSpec("allocator cache", STEP, False,
                 "fragmentation: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                 follows=_TENSORS),
    ),
}
SCORES_ADVICE = "--attention sdpa stores no T×T scores"


def parts_for(device: str) -> tuple[PartSpec, ...]:
    return PARTS["cuda" if str(device).startswith("cuda") else "cpu"]


# ---- fitting --------------------------------------------------------------------------------
def _features(b: float, t: float, quadratic: bool) -> list[float]:
    return [1.0, b * t, b * t * t] if quadratic else [1.0, b * t]


def ok_points(points: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in points if p.get("status") == OK and p.get("parts")]


def fit_points(points: Sequence[dict[str, Any]], device: str = "cpu") -> dict[str, Any]:
    """The fit of the ok points' parts (module docstring); FitError with the reason when they
    cannot make one. Each point: batch_size, seq_len, status, parts {name: bytes},
    peak_bytes, counter_peak_bytes, scores_bytes, spread."""
    fresh = [p for p in ok_points(points) if p.get("role") == FRESH]
    pts = [p for p in ok_points(points) if p.get("role") != FRESH]
    if len(pts) < 2:
        raise FitError(f"{len(pts)} probe point(s) measured; a fit needs at least 2")
    bs = {p["batch_size"] for p in pts}
    ts = {p["seq_len"] for p in pts}
    scores = any((p.get("scores_bytes") or 0) > 0 for p in pts)
    quadratic = len(ts) >= 2 and scores
    specs = parts_for(device)
    data = _fit_parts(pts, specs, quadratic)
    if quadratic and _total_coef(data, 2) < 0:  # the measurements show no T² growth after all
        quadratic = False
        data = _fit_parts(pts, specs, False)
    fit = {"device": "cuda" if str(device).startswith("cuda") else "cpu",
           "quadratic": quadratic, "scores_measured": scores,
           "features": ["1", "B·T", "B·T²"][:3 if quadratic else 2],
           "batch_varied": len(bs) > 1, "seq_varied": len(ts) > 1,
           "batch_sizes": sorted(bs), "seq_lens": sorted(ts), "parts": data,
           "scores": _fit_scores(pts, quadratic) if scores else None}
    fit["residuals"] = [_residual(fit, p) for p in pts]
    first = _rest_sum(pts[0], specs)
    fit["rest_drift_bytes"] = max(_rest_sum(p, specs) - first for p in pts)
    fit["spread"] = max((p.get("spread") or 0.0) for p in pts)
    fit["fresh"] = [_fresh_row(fit, p) for p in fresh]
    worst_fresh = max(fit["fresh"], key=lambda r: abs(r["error"]), default=None)
    fit["run_to_run"] = abs(worst_fresh["error"]) if worst_fresh else None
    fit["run_to_run_bytes"] = abs(worst_fresh["measured_bytes"] - worst_fresh[
        "predicted_bytes"]) if worst_fresh else None
    fit["run_to_run_step_bytes"] = _step_bytes(fit, worst_fresh["batch_size"], worst_fresh[
        "seq_len"]) if worst_fresh else None
    fit["extrapolation_error"], fit["extrapolation_ratio"] = _leave_largest_out(
        pts, device, quadratic)
    fit["largest_footprint"] = max(p["batch_size"] * p["seq_len"] for p in pts)
    worst = max((abs(r["peak"]) for r in fit["residuals"]), default=0.0)
    fit["max_residual"] = worst
    fit["fit_band"] = max(worst, fit["spread"])  # the fit's own, in this process
    fit["band"] = fit["fit_band"] + (fit["run_to_run"] or 0.0)  # within the probe's sizes
    fit["poor"] = fit["band"] > GOOD_FIT
    loo, ratio = fit["extrapolation_error"], fit["extrapolation_ratio"]
    fit["per_doubling"] = (abs(loo) / math.log2(ratio)
                           if loo is not None and ratio and ratio > 1 else None)
    return fit


def band_at(fit: dict[str, Any], b: float, t: float) -> float:
    """The band of a prediction at (B, T), its terms added (they are separate errors):

    - the fit's own (``fit_band``: residuals and step-to-step spread, in the probe's process);
    - run to run: how far the fresh process at the probe's largest point measured from the
      prediction, in bytes, grown with the step's part (what lies above the rest level: the
      heap's free pages during backward, which differ from process to process, follow the
      step's tensors), over the predicted peak at (B, T). Ten `memtop fit --verify` runs of
      the default CPU model at 700 MiB (amp off and bf16): the largest B measured -1.9% to
      +3.6% off its prediction; bands from the fit and the extrapolation alone held 7 of 10,
      with this term added 8 of 10;
    - past the probe's sizes, the leave-one-out error per doubling (how far the largest point
      was off when predicted from the others, over how many doublings of B·T it lay past
      them) times the doublings of B·T past the largest point. Measured: from B ≤ 4 the bf16
      default model's B = 43 was 10.9% off (3.4 doublings); from all six points B = 290 (2.8
      more) was 8.1% off, the band said 9.7%.

    A fit.json from before the run-to-run point has ``band`` alone for the first two."""
    base = float(fit.get("fit_band", fit["band"]))
    fresh, fresh_step = fit.get("run_to_run_bytes"), fit.get("run_to_run_step_bytes")
    if fresh:
        peak = predict(fit, b, t)["peak_bytes"]
        grow = max(1.0, _step_bytes(fit, b, t) / fresh_step) if fresh_step and fresh_step > 0 \
            else 1.0
        base += fresh * grow / peak if peak > 0 else 0.0
    per = fit.get("per_doubling")
    reach = b * t / fit["largest_footprint"]
    if per is None or reach <= 1:
        return base
    return base + per * math.log2(reach)


def _step_bytes(fit: dict[str, Any], b: float, t: float) -> float:
    """The predicted peak at (B, T) above the rest level: what the step adds."""
    return sum(v for name, v, _ in _part_values(fit, b, t)
               if not any(q["name"] == name and "bytes" in q for q in fit["parts"]))


def _fit_parts(pts: list[dict[str, Any]], specs: Sequence[PartSpec],
               quadratic: bool) -> list[dict[str, Any]]:
    rows = [_features(p["batch_size"], p["seq_len"], quadratic) for p in pts]
    if matrix_rank(rows) < len(rows[0]):
        raise FitError("the probe points do not separate the terms "
                       f"({', '.join(['1', 'B·T', 'B·T²'][:len(rows[0])])}): they need more "
                       "distinct sizes")
    out = []
    for spec in sorted(specs, key=lambda sp: bool(sp.follows)):  # overheads after what they
        values = [p["parts"].get(spec.name) for p in pts]       # follow
        if all(v is None for v in values):
            continue  # a part this run does not have (no autocast: no weight copies)
        ys = [float(v or 0) for v in values]
        entry: dict[str, Any] = {"name": spec.name, "kind": spec.kind,
                                 "in_counter": spec.in_counter}
        if spec.kind == REST:
            entry["bytes"] = ys[0]  # as the first point held it (module docstring)
        elif spec.follows:
            entry["coef"], entry["share"] = _follow(pts, ys, spec.follows, out)
        else:
            entry["coef"] = least_squares(rows, ys)
        out.append(entry)
    order = [sp.name for sp in specs]
    return sorted(out, key=lambda e: order.index(e["name"]))


def _follow(pts: list[dict[str, Any]], ys: list[float], names: tuple[str, ...],
            fitted: list[dict[str, Any]]) -> tuple[list[float], float]:
    """An overhead as c + β·(the parts it follows), β ≥ 0, by least squares over the points'
    measured values; returned in the fit's basis (c + β × those parts' coefficients)."""
    xs = [sum(float(p["parts"].get(n) or 0) for n in names) for p in pts]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    beta = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
               / var) if var > 0 else 0.0
    c = mean_y - beta * mean_x
    base = [q["coef"] for q in fitted if q["name"] in names and "coef" in q]
    width = max((len(b) for b in base), default=1)
    coef = [sum(b[i] for b in base if i < len(b)) * beta for i in range(width)]
    coef[0] += c
    return coef, beta


def _fit_scores(pts: list[dict[str, Any]], quadratic: bool) -> list[float]:
    rows = [_features(p["batch_size"], p["seq_len"], quadratic) for p in pts]
    return least_squares(rows, [float(p.get("scores_bytes") or 0) for p in pts])


def _total_coef(parts: list[dict[str, Any]], index: int) -> float:
    return sum(p["coef"][index] for p in parts if "coef" in p and len(p["coef"]) > index)


def _leave_largest_out(pts: list[dict[str, Any]], device: str,
                       quadratic: bool) -> tuple[float | None, float | None]:
    """(relative error, B·T ratio): the largest point's peak predicted from the others, and
    how far past them it is (None, None when the others cannot make a fit): the fit's own
    extrapolation, measured."""
    largest = max(pts, key=lambda p: (p["batch_size"] * p["seq_len"], p["batch_size"]))
    size = (largest["batch_size"], largest["seq_len"])
    rest = [p for p in pts if (p["batch_size"], p["seq_len"]) != size]  # measured twice: both
    if len(rest) < 2:
        return None, None
    try:
        sub = {"parts": _fit_parts(rest, parts_for(device), quadratic), "quadratic": quadratic}
    except FitError:
        return None, None
    predicted = _own_rest(largest, sub, counter=False)
    measured = largest.get("peak_bytes")
    ratio = largest["batch_size"] * largest["seq_len"] / max(
        p["batch_size"] * p["seq_len"] for p in rest)
    return ((measured - predicted) / measured if measured else None), ratio


def _part_values(fit: dict[str, Any], b: float, t: float) -> list[tuple[str, float, bool]]:
    feats = _features(b, t, fit["quadratic"])
    out = []
    for part in fit["parts"]:
        value = part["bytes"] if "bytes" in part else sum(
            c * f for c, f in zip(part["coef"], feats, strict=False))
        out.append((part["name"], float(value), bool(part["in_counter"])))
    return out


def _rest_sum(p: dict[str, Any], specs: Sequence[PartSpec]) -> float:
    return sum(float(p["parts"].get(s.name) or 0) for s in specs if s.kind == REST)


def _own_rest(p: dict[str, Any], fit: dict[str, Any], counter: bool) -> float:
    """The fit's prediction at the point with the rest parts the point itself held: what a
    probe point grew between steps (kernels cached per shape) is history, not the fit's."""
    total = 0.0
    for name, value, inc in _part_values(fit, p["batch_size"], p["seq_len"]):
        if counter and not inc:
            continue
        rest = next((q for q in fit["parts"] if q["name"] == name and "bytes" in q), None)
        total += float(p["parts"].get(name) or 0) if rest is not None else value
    return total


def _residual(fit: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
    b, t = p["batch_size"], p["seq_len"]
    peak, counter = _own_rest(p, fit, False), _own_rest(p, fit, True)

    def rel(measured: Any, predicted: float) -> float | None:
        return (measured - predicted) / measured if measured else None

    return {"batch_size": b, "seq_len": t, "measured_bytes": p.get("peak_bytes"),
            "predicted_bytes": round(peak), "peak": rel(p.get("peak_bytes"), peak) or 0.0,
            "counter_measured_bytes": p.get("counter_peak_bytes"),
            "counter_predicted_bytes": round(counter),
            "counter": rel(p.get("counter_peak_bytes"), counter)}


def _fresh_row(fit: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
    """A fresh process's point against the prediction (the first point's rest level, as an
    answer's): measured minus predicted, as the residuals."""
    pred = predict(fit, p["batch_size"], p["seq_len"])
    measured = p.get("peak_bytes") or 0
    counter = p.get("counter_peak_bytes")
    return {"batch_size": p["batch_size"], "seq_len": p["seq_len"],
            "measured_bytes": measured, "predicted_bytes": pred["peak_bytes"],
            "error": (measured - pred["peak_bytes"]) / measured if measured else 0.0,
            "counter_measured_bytes": counter,
            "counter_predicted_bytes": pred["counter_peak_bytes"],
            "counter": ((counter - pred["counter_peak_bytes"]) / counter) if counter else None}


def predict(fit: dict[str, Any], b: float, t: float) -> dict[str, Any]:
    """The predicted peak at (B, T), the counter's own peak and each part's bytes."""
    values = _part_values(fit, b, t)
    out = {"batch_size": b, "seq_len": t,
           "peak_bytes": round(sum(v for _, v, _ in values)),
           "counter_peak_bytes": round(sum(v for _, v, inc in values if inc)),
           "parts": {name: round(v) for name, v, _ in values}}
    if fit.get("scores"):
        feats = _features(b, t, fit["quadratic"])
        out["scores_bytes"] = round(sum(c * f for c, f in zip(fit["scores"], feats,
                                                               strict=False)))
    return out


def _line(fit: dict[str, Any], t: float) -> tuple[float, float]:
    """(K, S): peak(B) = K + S·B at context T."""
    k = s = 0.0
    for part in fit["parts"]:
        if "bytes" in part:
            k += part["bytes"]
            continue
        c = part["coef"]
        k += c[0]
        s += c[1] * t + (c[2] * t * t if len(c) > 2 else 0.0)
    return k, s


def largest_batch(fit: dict[str, Any], t: float, limit: float) -> int | None:
    """The largest B whose predicted peak at T is at most ``limit`` (0: not even B=1);
    None when the fit sees no growth with B (points noisier than their sizes differ)."""
    k, s = _line(fit, t)
    if s <= 0:
        return None
    return max(0, math.floor((limit - k) / s))


def largest_seq(fit: dict[str, Any], b: float, limit: float) -> float:
    """The largest T (not rounded, not capped by the model's context) whose predicted peak at
    B is at most ``limit``; 0 when not even T=1 fits, inf when the fit sees no growth."""
    const = lin = quad = 0.0
    for part in fit["parts"]:
        if "bytes" in part:
            const += part["bytes"]
            continue
        c = part["coef"]
        const += c[0]
        lin += c[1] * b
        quad += (c[2] * b) if len(c) > 2 else 0.0
    room = limit - const
    if room < lin + quad:  # T=1 does not fit
        return 0.0
    if quad > 0:
        return (-lin + math.sqrt(lin * lin + 4 * quad * room)) / (2 * quad)
    return room / lin if lin > 0 else math.inf
