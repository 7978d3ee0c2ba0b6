"""Two ranks (torch's own launcher, gloo on CPU, a user's DDP loop under probes.Monitor) where
rank 1's loader sleeps: its data wait is the straggler, named by the rank table (issue 26).

Under DDP rank 0 waits for rank 1 inside its backward (the all-reduce): the slowest rank's line
names the cause (rank 1's data wait), not where the others wait."""

from __future__ import annotations

import subprocess
import sys

import pytest
from factories import ROOT, metrics_rows, subprocess_env, wait_for

from tui.app import MemtopApp

pytestmark = pytest.mark.slow  # torchrun and two ranks that import torch

STEPS = 12
SLEEP_S = 0.04  # rank 1's loader, outside the step
LOOP = f"""
import os, sys, time
import torch
import torch.distributed as dist
from probes import Monitor
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with Monitor(model, opt, run_folder=sys.argv[1], listen=False, profiler=False,
             leak_watch=False, ledger=False, write_report=False, warmup_steps=1) as mon:
    for _ in range({STEPS}):
        if rank == 1:
            time.sleep({SLEEP_S})
        x = torch.randn(8, 32)
        with mon.step() as s:
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            s.set(loss=loss)
dist.destroy_process_group()
"""


async def test_a_slow_loader_on_rank_1_is_named_with_its_phase(tmp_path):
    script, run = tmp_path / "loop.py", tmp_path / "run"
    script.write_text(LOOP)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(script), str(run)], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=subprocess_env(), stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    slow, _ = metrics_rows(run, "metrics-rank-1.jsonl")
    fast, _ = metrics_rows(run, "metrics-rank-0.jsonl")
    assert len(slow) == len(fast) == STEPS
    assert all(r["data_wait_ms"] >= SLEEP_S * 1000 * 0.75 for r in slow[1:])  # the sleep: a floor
    assert all(r["backward_ms"] is not None for r in fast + slow)
    app = MemtopApp.for_folder(run, refresh_s=0.1, freeze_gc=False)
    async with app.run_test(size=(80, 24)) as pilot:
        assert app.view == "ranks"
        await wait_for(pilot, lambda: "slowest: rank" in app.rank_table.text,
                       "the slowest rank's line")
        text = app.rank_table.text
        assert "slowest: rank 1, +" in text and "ms in data wait" in text
        assert "split" in text and "wait" in text  # each rank's phase medians
        assert "slowest: rank 0" not in text
    from probes.analysis.report.build import write_report

    md = write_report(run).read_text()
    assert "- Slowest: rank 1, +" in md and "ms in data wait" in md
    assert "## Where the step went" in md
