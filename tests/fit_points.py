"""Probe points of `memtop fit` built from known laws (tests/unit/test_fit_math.py,
test_fit_screen.py): each part of the peak follows its law exactly unless told to be off it."""

from __future__ import annotations

from probes.analysis.fit import OK

MIB = 1024 * 1024
PARAMS, OPT, RUNTIME, OUTSIDE, GRADS = 3 * MIB, 6 * MIB, 120 * MIB, 280 * MIB, 3 * MIB
ACT_BT, ACT_BT2 = 40_000.0, 64.0  # bytes per B·T and per B·T² (T×T scores)
TMP0, TMP_BT = 150_000.0, 1_000.0
BWD0, BETA = -2 * MIB, 0.5  # backward's part: a constant plus half the step's tensors


def cpu_point(b: int, t: int, quadratic: bool = True, noise: float = 0.0,
              rest_extra: float = 0.0, act_noise: float = 0.0) -> dict:
    """A probe point whose parts follow the laws above exactly (``noise``: the backward part
    off its law by this share of the peak, ``rest_extra``: runtime heap the probe's history
    added)."""
    acts = ACT_BT * b * t + (ACT_BT2 * b * t * t if quadratic else 0)
    acts += act_noise * true_peak(b, t, quadratic)  # data-dependent shapes: off their law
    tmp = TMP0 + TMP_BT * b * t
    bwd = BWD0 + BETA * (acts + tmp)
    bwd += noise * true_peak(b, t, quadratic)  # off the trend by this share of the peak
    parts = {"parameters": PARAMS, "optimizer state": OPT, "runtime heap": RUNTIME + rest_extra,
             "outside the heap": OUTSIDE, "gradients": GRADS, "autocast weight copies": None,
             "saved activations": acts, "temporaries": tmp, "backward and free heap": bwd}
    peak = sum(v or 0 for v in parts.values())
    counter = PARAMS + OPT + RUNTIME + rest_extra + acts + tmp
    return {"batch_size": b, "seq_len": t, "status": OK, "parts": parts, "peak_bytes": peak,
            "counter_peak_bytes": counter, "spread": 0.0,
            "scores_bytes": ACT_BT2 * b * t * t if quadratic else 0}


def true_peak(b: float, t: float, quadratic: bool = True) -> float:
    rest = PARAMS + OPT + RUNTIME + OUTSIDE
    tensors = TMP0 + (ACT_BT + TMP_BT) * b * t + (ACT_BT2 * b * t * t if quadratic else 0.0)
    return rest + GRADS + BWD0 + (1 + BETA) * tensors


GRID = [(1, 128), (2, 128), (4, 128), (4, 32), (4, 64)]


def fit_meta(**kw) -> dict:
    return {"device": "cpu", "amp": "off", "attention": "explicit", "params": 842_496,
            "budget_bytes": 2048 * MIB, "budget_source": "--memory", "headroom_pct": 10.0,
            "vary": "both", "batch_size": 16, "seq_len": 128, "max_seq_len": 256,
            "peak_name": "peak RSS", "counter_peak_name": "peak heap used",
            "peak_source": "process RSS high-water mark (VmHWM)", **kw}
