"""GPU claims about the DataLoader workers (issue 43, probes/counters/workers.py): on a CUDA run a
workers' leak is alerted as the workers' and its time to full is against the host's RAM (the
device's --max-memory does not hold host pages); the workers' sampler costs the default GPT's
CUDA step nothing measurable. Checked on CPU by tests/integration/test_workers.py; NOT RUN here
without a GPU."""

from __future__ import annotations

import statistics
import tempfile
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.gpu.registry import Ctx, Outcome, claim, free_device

LEAK_BYTES = 512 * 1024
PAIRS = 7


class _Items(Dataset):
    """Small items; ``leak_bytes`` kept per item in the worker (a cache in __getitem__)."""

    def __init__(self, leak_bytes: int = 0) -> None:
        self.leak_bytes, self.cache = leak_bytes, {}

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> Any:
        if self.leak_bytes:
            self.cache[i] = bytearray(self.leak_bytes)
        return torch.full((8,), float(i % 7)), torch.tensor(i % 2)


@claim("workers_leak_on_cuda", "a DataLoader workers' leak (512 KiB per item, 2 fork workers) "
       "on a CUDA loop is alerted as the workers' within 10 steps of their first reading, and "
       "its time to full is against the host's RAM, not the device", group="workers",
       needs_s=60, priority=80)
def workers_leak_on_cuda(ctx: Ctx) -> Outcome:
    from probes import Monitor
    from probes import records as R
    from probes.counters.fill import TREE_COUNTER

    device = torch.device("cuda", 0)
    model = torch.nn.Linear(8, 2).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(_Items(LEAK_BYTES), batch_size=16, num_workers=2,
                        persistent_workers=True, multiprocessing_context="fork")
    events: list[Any] = []
    first_seen: int | None = None
    with tempfile.TemporaryDirectory() as tmp:
        with Monitor(model, opt, run_dir=tmp, workers_sample_s=0.2, listen=False,
                     profiler=False, write_report=False, sinks=[events.append]) as mon:
            batches, seq = iter(loader), 0
            for step in range(1, 21):
                reading = mon.session.workers.wait_for_reading(seq, 60)
                assert reading is not None, "the workers' sampler took no reading"
                seq = reading.seq
                if first_seen is None and reading.workers:
                    first_seen = step
                x, y = (t.to(device) for t in next(batches))
                with mon.step() as scope:
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    scope.set(loss=loss)
            del batches
    free_device()
    alerts = [e.data for e in events if getattr(e, "event", None) == R.LEAK_SUSPECTED]
    steps = [e.step for e in events if getattr(e, "event", None) == R.LEAK_SUSPECTED]
    figures = {"alerts": [a.get("counter") for a in alerts], "alert_steps": steps,
               "first_seen_step": first_seen,
               "fill": [(a.get("fill_counter"), a.get("limit_name")) for a in alerts]}
    ok = (len(alerts) == 1 and alerts[0].get("counter") == R.WORKERS_COUNTER
          and first_seen is not None and steps[0] - first_seen <= 10
          and alerts[0].get("fill_counter") == TREE_COUNTER
          and alerts[0].get("limit_name") == "host RAM available")
    return Outcome.check(ok, f"alerts {figures['alerts']} at steps {steps} (workers first "
                             f"read at step {first_seen}); fill {figures['fill']}", **figures)


def _gpt_tokens_per_s(sampled: bool, steps: int = 60, warm: int = 10) -> float:
    from benchmarks.cases.step_cost.workers_sampler import gpt_run  # the CPU figure's loop

    try:
        return gpt_run(sampled, steps, warm, torch.device("cuda", 0))
    finally:
        free_device()


@claim("workers_sampler_step_ratio_cuda", "the workers' sampler (1 Hz, 2 workers) keeps the "
       "default GPT's CUDA throughput: median on/off ratio of 7 interleaved pairs within the "
       "off/off (A/A) spread", group="workers", needs_s=240, priority=81)
def workers_sampler_step_ratio_cuda(ctx: Ctx) -> Outcome:
    ratios, aa = [], []
    for r in range(PAIRS):
        order = ("off", "on", "off2") if r % 2 == 0 else ("off2", "on", "off")
        got = {side: _gpt_tokens_per_s(side == "on") for side in order}
        ratios.append(got["on"] / got["off"])
        aa.append(got["off2"] / got["off"])
    med, spread = statistics.median(ratios), max(abs(1 - a) for a in aa)
    return Outcome.check(med >= 1 - max(spread, 0.01),
                         f"on/off median {med:.3f} (min–max {min(ratios):.3f}–"
                         f"{max(ratios):.3f}); A/A {min(aa):.3f}–{max(aa):.3f}",
                         ratios=ratios, aa=aa, median=med)
