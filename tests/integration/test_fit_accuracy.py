"""`memtop fit`'s accuracy, measured (issue 41): from B in {1, 2, 4} and T in {32, 64}, the peak
at B = 16 and 32 and at T = 256 predicted within 10% of the peak measured in a fresh process
(the prediction is for a fresh run), for memtop's GPT and for a Hugging Face GPT-2 built from a
config; and the largest B for a budget runs under it while B × 1.25 goes over (measured).

The probe and the far sizes are measured in fresh processes, each size from the heap's rest
level (as `memtop fit` measures its points); the budget's bracket, one fresh process per size.
The models are small, so each process takes seconds."""

from __future__ import annotations

import json
import math

import pytest
from factories import run_python

from probes.analysis.fit import OK, fit_points, predict
from probes.analysis.fit_answer import answer
from probes.analysis.fit_plan import probe_grid

# one worker runs the module: its tests share the GPT's probe (gpt_probe)
pytestmark = pytest.mark.xdist_group("fit_accuracy")

PROBE = probe_grid(4, 64, "both", batches=[1, 2, 4], seq_lens=[32, 64])
TARGETS = [(16, 64), (32, 64), (4, 256)]
GPT = {"device": "cpu", "amp": "off", "layers": 2, "heads": 2, "dim": 64, "batch_size": 4,
       "seq_len": 64, "block_size": 256, "steps": 0, "warmup_steps": 0, "save_weights": False}

# a child: memtop's GPT through the probe `memtop fit` runs (trainer/fitprobe.py)
_GPT_CHILD = """
import json, sys, tempfile
from pathlib import Path
from trainer.config import TrainConfig
from trainer.fitprobe import FitProbe
cfg = TrainConfig(**json.loads(sys.argv[1]))
points = [tuple(p) for p in json.loads(sys.argv[2])]
budget, headroom = json.loads(sys.argv[3]) if len(sys.argv) > 3 else (None, 10.0)
probe = FitProbe(cfg, Path(tempfile.mkdtemp()), points, budget_bytes=budget,
                 headroom_pct=headroom, refine=budget is not None, listen=False)
probe.start(); probe.join()
print(json.dumps(probe.points))
"""

# a child: a Hugging Face GPT-2 from its config (nothing downloaded), through the same meter
_HF_CHILD = """
import json, sys, tempfile
from pathlib import Path
import torch
from transformers import GPT2Config, GPT2LMHeadModel
from trainer.fitmeter import probe_model
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256,
                                   n_positions=256))
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
gen = torch.Generator().manual_seed(0)
def step(b, t):
    ids = torch.randint(0, 256, (b, t), generator=gen)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.logits, out.loss
points = [tuple(p) for p in json.loads(sys.argv[1])]
print(json.dumps(probe_model(model, opt, points, step, Path(tempfile.mkdtemp()))))
"""


def measure(kind: str, points: list[tuple[int, int]], budget: int | None = None,
            headroom_pct: float = 10.0) -> list[dict]:
    """The points measured in one fresh process (with a budget: `memtop fit`'s probe, its
    refine point between the probe and the answer included)."""
    args = [json.dumps(GPT), json.dumps(points)] if kind == "gpt" else [json.dumps(points)]
    if budget is not None:
        args.append(json.dumps([budget, headroom_pct]))
    done = run_python(_GPT_CHILD if kind == "gpt" else _HF_CHILD, *args, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    pts = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(p["status"] == OK for p in pts), pts
    return pts


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt", "hf-gpt2"])
def test_far_sizes_are_predicted_within_10_percent(kind, request):
    points = request.getfixturevalue("gpt_probe") if kind == "gpt" else measure(kind, PROBE)
    fit = fit_points(points, "cpu")
    assert fit["batch_varied"] and fit["seq_varied"]
    # the targets in one fresh process, as `memtop fit`'s probe measures its points: the heap
    # trimmed to its rest level and the peak reset before each (trainer/fitmeter.py)
    measured = {(p["batch_size"], p["seq_len"]): p for p in measure(kind, TARGETS)}
    for b, t in TARGETS:
        got = measured[(b, t)]
        want = predict(fit, b, t)
        for key in ("peak_bytes", "counter_peak_bytes"):  # RSS peak, heap peak
            error = (want[key] - got[key]) / got[key]
            assert abs(error) < 0.10, (kind, b, t, key, error)
        # what the fit models, apart from the process's own ~400 MiB: the step's part
        rest = sum(p["bytes"] for p in fit["parts"] if "bytes" in p)
        step_error = (want["peak_bytes"] - got["peak_bytes"]) / (got["peak_bytes"] - rest)
        assert abs(step_error) < 0.5, (kind, b, t, step_error)  # glibc's backward pages
        # grow faster than the step (trainer/fitprobe.py): within half, 4-8x past the probe


# The step's part at B set to 3 × the process's own ~420 MiB and a 5% headroom. So far past the
# probe (B ~ 1000 from B ≤ 4) a fresh process's peak was seen 9% under and 7% over the fit's
# line: the bracket is the answer's own band (fit_answer.py: "low" and "high", the largest B
# at the budget less and plus the band), which the screen shows as a range when it is wide
HEADROOM_PCT = 5.0
STEP_OVER_REST = 3.0


@pytest.fixture(scope="module")
def gpt_probe() -> list[dict]:
    """The probe's points for memtop's GPT, measured once for the module's tests."""
    return measure("gpt", PROBE)


@pytest.mark.slow
def test_the_largest_batch_for_a_budget_runs_under_it_and_a_quarter_more_goes_over(gpt_probe):
    """`memtop fit`'s way: a probe (its refine point included) for a budget where the step's
    part is most of the peak; the largest B the answer promises (the low end of its band)
    runs under the budget, 1.25 × the high end over it, each measured in a fresh process."""
    first = fit_points(gpt_probe, "cpu")
    rest = predict(first, 0, 64)["peak_bytes"]
    per_b = predict(first, 1, 64)["peak_bytes"] - rest
    budget = int(rest * (1 + STEP_OVER_REST) / (1 - HEADROOM_PCT / 100))
    pts = measure("gpt", PROBE, budget, HEADROOM_PCT)
    refine = [(p["batch_size"], p["seq_len"]) for p in pts if p.get("role") == "refine"]
    assert any(t == 64 and b > 4 for b, t in refine)  # between the probe and the answer
    fit = fit_points(pts, "cpu")
    batch = answer(fit, budget, HEADROOM_PCT, 4, 64, 256)["batch"]
    best, low, high = batch["largest"], batch["low"] or 1, batch["high"] or batch["largest"]
    guess = STEP_OVER_REST * rest / per_b  # what the first probe's line says
    assert 0.5 * guess <= best <= 2 * guess and low <= best <= high
    (under,) = measure("gpt", [(low, 64)])  # what the answer promises, within its band
    (over,) = measure("gpt", [(math.ceil(high * 1.25), 64)])
    assert under["peak_bytes"] <= budget < over["peak_bytes"], (
        best, low, high, batch["band"], under["peak_bytes"], over["peak_bytes"], budget)
