"""memtop's cost per training step, measured on one model in one process: blocks of plain steps
and blocks of monitored steps, interleaved.

Why not two processes: on these 2-core machines one process differs from the next by ±10% in
tokens/s (heap layout, which core, page faults — benchmarks/results/2026-12-02.md "Where
the headless gap went"), so a process-level ratio cannot tell 1% from noise. Here the same
model, optimizer, heap and threads alternate between blocks of ``--block`` plain steps and
``--block`` steps inside ``Monitor.step()``, in rounds [plain, monitored, plain'] (odd rounds
reversed, benchmarks/harness/pairs.py); plain'/plain is the A/A noise. The monitored side is
what a headless run does each step: every instrument on (profiler window ready, leak watch,
ledger every 50 steps, hints), the request socket listening, metrics.jsonl written; memtop's
trainer also brackets forward/backward/optimizer with record_function, so the GPT's monitored
steps do too.

What a block cannot show (the process-wide part) is measured beside it: the CPU that memtop's
own threads (``memtop-*``: the request socket) used over the run, as a share of a core.

    python -m benchmarks run step_overhead [--model gpt|cnn] [--pairs 25] [--block 4] [--amp off]
    python -m benchmarks run step_overhead --model sweep [--steps-ms 1,3,10,30] [--pairs 15]

``--model sweep`` (issue 28) judges the cost at GPU speed: synthetic steps of real torch work
sized to 1, 3, 10 and 30 ms (synthetic_step.py beside this file), each its own model and Monitor,
blocks of ~100 ms, the same interleaving and A/A band. Targets: 0.95 at 1 ms (a 50 µs budget),
0.99 at 3 ms, 0.995 at 10 and 30 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time

import torch
from torch import nn
from torch.profiler import record_function

from benchmarks.harness import (
    RATIO_HEADER,
    in_thread,
    load_note,
    median,
    publish,
    run_pairs,
    thread_cpu_s,
    units_per_s,
    wait_quiet,
)
from benchmarks.harness.examples import example
from probes import Monitor
from trainer.config import TrainConfig
from trainer.data import BatchSampler, load_corpus
from trainer.model import GPT

TARGET = 0.99
SWEEP_TARGETS = {1.0: 0.95, 3.0: 0.99, 10.0: 0.995, 30.0: 0.995}  # step ms -> ratio target
AMP = {"bf16": torch.bfloat16}


class Workload:
    """One model, its optimizer and data, and a Monitor over them, stepped either way."""

    def __init__(self, model: str, amp: str, run_dir: str) -> None:
        torch.manual_seed(0)
        self.dtype = AMP.get(amp)
        self.kind = model
        if model == "gpt":
            cfg = TrainConfig(device="cpu", run_dir=run_dir, amp=amp)
            self.model: nn.Module = GPT(cfg.model_config())
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr,
                                               weight_decay=0.1)
            batches = BatchSampler(load_corpus(), cfg.batch_size, cfg.seq_len, cfg.seed,
                                   torch.device("cpu"))
            self.next_batch = batches.next_batch
            self.clip = cfg.grad_clip
            self.units = cfg.batch_size * cfg.seq_len  # tokens per step
            kwargs = {"tokens_per_step": self.units}
            self.describe = (f"memtop's default GPT (B={cfg.batch_size}, T={cfg.seq_len}, "
                             f"{cfg.layers} layers, dim {cfg.dim}), AdamW, clip {cfg.grad_clip}")
        else:
            own_loop = example("own_loop")
            self.model = own_loop.SmallCNN()
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
            data = own_loop.synthetic_batches(32, torch.device("cpu"))
            self.next_batch = lambda: next(data)
            self.loss_fn = nn.CrossEntropyLoss()
            self.clip = 0.0
            self.units = 32  # samples per step
            kwargs = {"samples_per_step": self.units}
            self.describe = "examples/own_loop.py's SmallCNN (B=32), AdamW"
        self.monitor = Monitor(self.model, self.optimizer, run_dir=run_dir, amp=amp,
                               write_report=False, **kwargs)

    def _forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.next_batch()
        with torch.autocast("cpu", dtype=self.dtype or torch.float32,
                            enabled=self.dtype is not None):
            if self.kind == "gpt":
                return self.model(x, y)
            out = self.model(x)
            return out, self.loss_fn(out, y)

    def plain_step(self) -> None:
        """The loop people write: forward, backward, clip, step, read the loss."""
        _, loss = self._forward()
        loss.backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss.item()

    def monitored_step(self) -> None:
        """The same step as memtop's trainer runs it (trainer/loop.py)."""
        ranges = self.kind == "gpt"
        with self.monitor.step() as s:
            with record_function("forward") if ranges else contextlib.nullcontext():
                out, loss = self._forward()
            with record_function("backward") if ranges else contextlib.nullcontext():
                loss.backward()
            with record_function("optimizer") if ranges else contextlib.nullcontext():
                norm = (torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
                        if self.clip else None)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            s.set(loss=loss, grad_norm=norm, output=out)

    def block(self, monitored: bool, steps: int) -> float:
        """``steps`` steps one way; returns units (tokens or samples) per second."""
        return units_per_s(self.monitored_step if monitored else self.plain_step, steps,
                           self.units)


def measure(args: argparse.Namespace) -> dict:
    """Everything on this (the training) thread, as memtop's trainer does."""
    with tempfile.TemporaryDirectory() as tmp:
        w = Workload(args.model, args.amp, tmp)
        for i in range(args.warm):  # both paths warm: allocator, autograd graph, the ledger
            w.block(i % 2 == 1, 1)
        cpu0, t0 = thread_cpu_s(), time.perf_counter()
        sides = {"plain": lambda: w.block(False, args.block),
                 "monitored": lambda: w.block(True, args.block)}
        pairs = run_pairs(args, "plain", sides, wait=False, show=args.verbose)
        wall = time.perf_counter() - t0
        cpu1 = thread_cpu_s()
        extra = {"memtop_threads": {n: (cpu1[n] - cpu0.get(n, 0.0)) / wall
                                    for n in cpu1 if n.startswith("memtop-")},
                 "monitored_steps": w.monitor.step_count,
                 "ledger_steps": next((len(h.measured_steps) for h in w.monitor.hooks
                                       if hasattr(h, "measured_steps")), 0),
                 "describe": w.describe}
        w.monitor.close()
    return pairs, extra


def sweep(args: argparse.Namespace) -> None:
    """Monitored / plain at each synthetic step length, on the training thread."""
    from benchmarks.cases.step_cost.synthetic_step import SyntheticStep

    torch.set_num_threads(1)  # one host thread, as a GPU loop's; a stable calibration
    rows, notes, loads, figures = [], [], [], []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for ms in [float(x) for x in args.steps_ms.split(",")]:
            w = SyntheticStep(ms, tmp)
            block = max(2, round(100.0 / max(w.step_ms, 0.05)))
            for i in range(2 * args.warm):
                w.block(i % 2 == 1, 1)
            pairs = run_pairs(args, "plain", {"plain": lambda w=w, b=block: w.block(False, b),
                                              "monitored": lambda w=w, b=block: w.block(True, b)},
                              wait=False, show=args.verbose)
            loads.extend(pairs.others)
            target = SWEEP_TARGETS.get(ms, TARGET)
            row, _verdict = pairs.row("monitored", f"{ms:g} ms step (Linear {w.dim}, measured "
                                      f"{w.step_ms:.2f} ms), samples/s", target)
            rows.append(row)
            figures.append(pairs.figure(f"step_overhead/sweep-{ms:g}ms", f"monitored / plain "
                                        f"at a synthetic {ms:g} ms step (GPU step lengths)",
                                        "monitored", target))
            cost_us = [(1 / m - 1 / p) * w.units * 1e6 for m, p in
                       zip(pairs.values["monitored"], pairs.values["plain"], strict=True)]
            notes.append(f"| {ms:g} ms | {block} | {median(cost_us):.0f} µs |")
            w.monitor.close()
    body = (
        f"Synthetic steps (cases/step_cost/synthetic_step.py: a square Linear's forward, backward, "
        f"SGD and the loss read, sized by calibration), CPU, 1 torch thread; per length its own "
        f"model and Monitor (every default instrument, metrics.jsonl), {args.pairs} rounds of "
        f"[plain, monitored, plain'] blocks of ~100 ms. {load_note(loads, args.max_busy)} Wall "
        f"time {(time.monotonic() - t0) / 60:.1f} min.\n\n{RATIO_HEADER}\n" + "\n".join(rows) +
        "\n\n| step | steps per block | memtop's cost per step (median of rounds) |\n"
        "|---|---|---|\n" + "\n".join(notes))
    publish(args, "Per-step cost at GPU step lengths, synthetic steps (issue 28)", body, figures)


def options(ap) -> None:
    ap.add_argument("--model", choices=("gpt", "cnn", "sweep"), default="gpt")
    ap.add_argument("--steps-ms", default="1,3,10,30", help="--model sweep: step lengths")
    ap.pairs(25, "plain, monitored, plain'")
    ap.add_argument("--block", type=int, default=4, help="steps per block")
    ap.add_argument("--warm", type=int, default=10, help="steps before the first round")
    ap.amp(("off", "bf16"), "off")
    ap.quiet()
    ap.verbose()


def main(args) -> None:
    wait_quiet(args.max_busy, args.max_wait, "before the first round")
    if args.model == "sweep":
        in_thread(sweep, args)
        return
    pairs, res = in_thread(measure, args)
    unit = "tokens/s" if args.model == "gpt" else "samples/s"
    row, verdict = pairs.row("monitored", f"monitored / plain steps ({args.model}), {unit}",
                             TARGET)
    vals = pairs.values
    total = (len(vals["monitored"]) / sum(1 / v for v in vals["monitored"])) / \
        (len(vals["plain"]) / sum(1 / v for v in vals["plain"]))
    threads = ", ".join(f"{n} {100 * c:.2f}%" for n, c in sorted(res["memtop_threads"].items()))
    ratios = pairs.ratios["monitored"]
    body = (
        f"Config: {res['describe']}, amp {args.amp}, CPU. One process, one model: {args.warm} "
        f"warm-up steps, then {args.pairs} rounds of [plain, monitored, plain'] blocks of "
        f"{args.block} steps (odd rounds reversed); A/A = plain'/plain of the same round. "
        f"Monitored steps: every instrument, the request socket, metrics.jsonl "
        f"({res['monitored_steps']} monitored steps, {res['ledger_steps']} of them measured by "
        f"the ledger). {pairs.note()} Wall time {pairs.minutes:.1f} min.\n\n"
        f"{RATIO_HEADER}\n{row}\n\n"
        f"| figure | value |\n|---|---|\n"
        f"| plain {unit}, median block | {median(vals['plain']):,.1f} |\n"
        f"| monitored {unit}, median block | {median(vals['monitored']):,.1f} |\n"
        f"| monitored / plain over all blocks (time-weighted, ledger steps included) | "
        f"{total:.3f} |\n"
        f"| CPU of memtop's own threads over the run (% of one core) | {threads or 'none'} |\n\n"
        f"Result: per-step cost of monitoring {verdict} (median ratio {median(ratios):.3f}, "
        f"{min(ratios):.3f}–{max(ratios):.3f}).")
    what = {"gpt": "memtop's per-step cost on its own GPT step, plain and monitored blocks "
                   "interleaved in one process",
            "cnn": "the same on a 35 ms step (examples/own_loop.py's CNN)"}[args.model]
    publish(args, f"Per-step cost, interleaved in one process ({args.model})", body,
            [pairs.figure(f"step_overhead/{args.model}", what, "monitored", TARGET)])
