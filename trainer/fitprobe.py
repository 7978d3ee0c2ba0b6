"""`memtop fit`'s probe: memtop's Trainer running probe points (B, T) instead of a training run,
each measured to a steady state by trainer/fitmeter.py, their peaks split into measured parts
(probes/analysis/fit.py PARTS), then up to REFINE_ROUNDS points between the probe and a far
answer.

    python -m trainer.fitprobe --config '{...}' --points 20x128 --budget BYTES --run-folder DIR

runs one point in a fresh process (`memtop fit --verify`): the prediction is for a fresh run,
which holds one shape's caches, not the probe's. The budget is then the run's --max-memory, so a
step over it on CPU is stopped by the memory guard (exit 3), not by the kernel; Ctrl-C / SIGTERM
stop it at a step boundary (exit 130 / 143).
`memtop fit` runs one such process at the probe's largest point too (role "fresh"): how far
a fresh process lies from the prediction is the run-to-run noise the band includes
(probes/analysis/fit.py).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from probes import records as R
from probes.analysis.fit import (
    DEFAULT_HEADROOM_PCT,
    NOT_RUN,
    OK,
    OOM,
    OVER,
    FitError,
    fit_points,
)
from probes.analysis.fit_answer import answer, refine_points
from probes.analysis.fit_plan import model_size_problem
from probes.counters.host import RssReader
from probes.instruments.ledger import Ledger
from probes.monitor.monitor import Monitor
from probes.monitor.scope import StepScope
from probes.tools.units import format_bytes
from trainer.config import TrainConfig
from trainer.data import BatchSampler, load_corpus
from trainer.fitmeter import MEASURED_STEPS, WARMUP_STEPS, PointMeter, default_budget
from trainer.loop import Trainer

REFINE_ROUNDS = 2  # points between the probe and a far answer, each halfway (geometric)
REFINE_MAX_S = 12.0  # a refine point whose steps would take longer (at the pace measured) is
# left out: `memtop fit` stays well under a minute (the band then says how far it reaches)


class FitProbe(Trainer):
    """memtop's trainer running probe points instead of a training run: the same model,
    optimizer, amp and Monitor (trainer/loop.py), each point's step ``Trainer.train_step``.

    ``on_point(probe)`` is called on the training thread after each point (fit.json is
    rewritten there: an interrupted probe leaves a valid partial file). ``refused``: bad input
    found once the device is known (a budget below the model's own size), said in one line."""

    thread_name = "memtop-fit"

    def __init__(self, config: TrainConfig, run_dir: Path, points: list[tuple[int, int]], *,
                 budget_bytes: int | None = None, headroom_pct: float = DEFAULT_HEADROOM_PCT,
                 refine: bool = True, on_point: Callable[[FitProbe], None] | None = None,
                 warmup: int = WARMUP_STEPS, steps: int = MEASURED_STEPS, role: str = "probe",
                 **kw: Any) -> None:
        self.ledger = Ledger(every=10**12, min_gap_s=math.inf)
        super().__init__(config, run_dir, hooks=[self.ledger], **kw)
        self.plan = list(points)
        self.points: list[dict[str, Any]] = []
        self.budget_bytes = budget_bytes
        self.budget_source = "--memory" if budget_bytes is not None else ""
        self.headroom_pct, self.refine, self.role = headroom_pct, refine, role
        self.on_point = on_point
        self.warmup, self.steps = warmup, steps
        self.refused: str | None = None
        self.params = 0
        self.peak_source = ""
        self.amp = ""
        self.device_text = ""  # the device the probe ran on, once known
        self.held_bytes: int | None = None  # the process with torch and the model, no step
        self.session.recorder.add_to_config(mode="fit")  # a probe of several shapes, not a
        # training run of config's B and T (the report and the header say so)

    def _train(self, mon: Monitor, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               scaler: torch.amp.GradScaler | None, batches: BatchSampler,
               device: torch.device, amp: str) -> None:
        self.amp, self.device_text = amp, str(device)
        self.params = sum(p.numel() for p in model.parameters())
        if self.budget_bytes is None:
            self.budget_bytes, self.budget_source = default_budget(device)
        self.held_bytes = held_bytes(device)
        if self.budget_bytes is not None:
            what = f"the budget ({self.budget_source})"
            self.refused = model_size_problem(self.budget_bytes, self.params, what) or \
                held_problem(self.budget_bytes, self.held_bytes, device, what)
            if self.refused:
                return
        model.train()
        meter = PointMeter(mon, self.ledger, optimizer, self.warmup, self.steps)
        self.peak_source = meter.peak_source
        corpus = load_corpus()

        def run_points(plan: list[tuple[int, int]], role: str) -> bool:
            for i, (b, t) in enumerate(plan):
                sampler = BatchSampler(corpus, b, t, self.config.seed, device)

                def run_step(s: StepScope, sampler: BatchSampler = sampler) -> None:
                    x, y = sampler.next_batch()
                    self.train_step(s, model, optimizer, scaler, x, y, device, amp)
                    s.set(tokens=x.numel())

                point = meter.measure(b, t, run_step)
                point["role"] = role
                budget = self.budget_bytes
                if point["status"] == OK and budget is not None \
                        and point["peak_bytes"] > budget:
                    point.update(status=OVER, reason=f"its peak {format_bytes(point['peak_bytes'])}"
                                 f" is over the budget {format_bytes(budget)}")
                self._record(mon, point)
                if point["status"] != OK:
                    why = {OVER: "a smaller point was over the budget",
                           OOM: "a smaller point ran out of memory"}.get(
                        point["status"], "the probe was stopped first")
                    for b2, t2 in plan[i + 1:]:
                        self._record(mon, {"batch_size": b2, "seq_len": t2, "status": NOT_RUN,
                                           "reason": why, "role": role})
                    return False
            return True

        if run_points(self.plan, self.role) and self.refine:
            for _ in range(REFINE_ROUNDS):  # each nearer the answer, while one is worth it
                extra = self._refine_plan()
                if not extra or not run_points(extra, "refine"):
                    break

    def _refine_plan(self) -> list[tuple[int, int]]:
        """Points between the probe and its answer (probes/analysis/fit_answer.py
        refine_points), where the answer lies far past the probed sizes."""
        cfg = self.config
        try:
            fit = fit_points(self.points, self.device_text)
        except FitError:
            return []
        if self.budget_bytes is None:
            return []
        ans = answer(fit, self.budget_bytes, self.headroom_pct, cfg.batch_size, cfg.seq_len,
                     cfg.block_size)
        done = {(p["batch_size"], p["seq_len"]) for p in self.points}
        ok = [p for p in self.points if p["status"] == OK and p.get("step_ms")]
        if not ok:
            return []
        big = max(ok, key=lambda p: p["batch_size"] * p["seq_len"])
        ms_per_token = big["step_ms"] / (big["batch_size"] * big["seq_len"])

        def seconds(b: int, t: int) -> float:  # its steps at the largest point's pace
            return (self.warmup + self.steps) * ms_per_token * b * t / 1000.0

        return [p for p in refine_points(fit, ans) if p not in done
                and seconds(*p) <= REFINE_MAX_S]

    def _record(self, mon: Monitor, point: dict[str, Any]) -> None:
        self.points.append(point)
        mon.emit(R.FIT_POINT, mon.step_count, point)
        if self.on_point is not None:
            self.on_point(self)


def held_bytes(device: torch.device) -> int | None:
    """What the process holds with torch and the model loaded, before a step: CPU, its RSS;
    CUDA, the allocator's reserved bytes."""
    if device.type == "cuda":
        return torch.cuda.memory_reserved(device)
    rss = RssReader()
    held = rss.read()
    rss.close()
    return held


def held_problem(budget: int, held: int | None, device: torch.device, what: str) -> str | None:
    """A CPU budget at or below what the process already holds (`memtop train --max-memory`'s
    rule, tui/commands/train.py held_problem, here with the model loaded too)."""
    if device.type == "cuda" or held is None or held < budget:
        return None
    return (f"{what} {format_bytes(budget)} is below what this process already holds (RSS "
            f"{format_bytes(held)} with torch and the model loaded): give a budget above the "
            "run's own size")


def main(argv: list[str] | None = None) -> int:
    """One verification point in a fresh process (`memtop fit --verify`)."""
    parser = argparse.ArgumentParser(prog="python -m trainer.fitprobe",
                                     description="Run memtop fit's probe points in this "
                                                 "process (its --verify runs one each).")
    parser.add_argument("--run-folder", required=True)
    parser.add_argument("--config", required=True, help="TrainConfig as JSON")
    parser.add_argument("--points", required=True, help="BxT[,BxT...], e.g. 20x128")
    parser.add_argument("--budget", type=int, default=None, help="bytes; the memory guard's "
                                                                  "limit too")
    parser.add_argument("--steps", type=int, default=MEASURED_STEPS + 1)
    parser.add_argument("--role", default="verify", help="the fit_point's role (fresh: the "
                                                         "probe's run-to-run point)")
    args = parser.parse_args(argv)
    from trainer.rank import _stop_on_signals, die_with_parent

    die_with_parent()
    try:
        points = [tuple(int(v) for v in p.split("x")) for p in args.points.split(",")]
        config = TrainConfig.from_json(json.loads(args.config))
    except ValueError as exc:
        print(f"memtop fitprobe: {exc}", file=sys.stderr)
        return 2
    probe = FitProbe(config, Path(args.run_folder), points, budget_bytes=args.budget,
                     steps=args.steps, refine=False, role=args.role, listen=False)
    received = _stop_on_signals(probe.control)
    probe.start()
    while not probe.join(timeout=0.2):
        pass
    if received:  # stopped by a signal: 130 / 143, as every memtop command
        return 128 + int(received[0])
    return 1 if probe.exit_code is None else probe.exit_code


if __name__ == "__main__":
    sys.exit(main())
