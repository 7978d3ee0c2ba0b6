"""memtop's per-step cost inside the frameworks: the same Hugging Face Trainer (or Lightning
Trainer) with and without ``MemtopCallback``, interleaved, with A/A noise.

Each side is one real ``trainer.train()`` (``fit()``) of ``--steps`` optimizer steps of
``--accum`` micro-batches on CPU over the model and data of examples/hf_trainer.py
(examples/lightning_fit.py), in one process, one thread. A clock callback (on both sides)
stamps the end of every optimizer step; the figure is optimizer steps per second from the end
of step ``--skip`` to the end of the last step, so the framework's and memtop's set-up (a run
folder, the socket, the Monitor) and the report at the end stay outside it, while everything
a step costs — memtop's step sample, instruments, metrics.jsonl line, the forward hooks, data
loading and HF's logging between steps — is inside. Rounds of [without, with, without']
(odd rounds reversed, benchmarks/harness/pairs.py); without'/without is the A/A noise. The
models keep training from round to round (the same weights, so every side does the same work).

    python -m benchmarks run framework_overhead --framework hf --pairs 15
    python -m benchmarks run framework_overhead --framework lightning --pairs 15
    python -m benchmarks run framework_overhead --pairs 2 --steps 20 --skip 5 --no-append  # smoke
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from benchmarks.harness import (
    RATIO_HEADER,
    BadInput,
    in_thread,
    median,
    publish,
    run_pairs,
    wait_quiet,
)
from benchmarks.harness.examples import example

TARGET = 0.99  # the same per-step target as a Monitor loop (the step_overhead case)


class Clock:
    """perf_counter at the end of each optimizer step, whatever the framework."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def steps_per_s(self, skip: int) -> float:
        ends = self.ends[skip - 1:] if skip > 0 else self.ends
        return (len(ends) - 1) / (ends[-1] - ends[0])


def hf_side(args: argparse.Namespace, tmp: Path, memtop: bool):
    """One HF Trainer (memtop's callback or not); returns a function that trains once."""
    from transformers import TrainerCallback

    from probes.integrations.transformers import MemtopCallback

    class HFClock(TrainerCallback):
        def __init__(self) -> None:
            self.clock = Clock()

        def on_step_end(self, *a, **k) -> None:
            self.clock.ends.append(time.perf_counter())

    hf_trainer = example("hf_trainer")
    stamp = HFClock()
    callbacks = [stamp] + ([MemtopCallback(tmp / "memtop")] if memtop else [])
    trainer = hf_trainer.make_trainer(
        tmp / ("with" if memtop else "without"), steps=args.steps, grad_accum=args.accum,
        batch_size=args.batch_size, logging_steps=10, eval_steps=None, save_steps=None,
        callbacks=callbacks, model=hf_trainer.tiny_gpt2(args.layers, args.dim))

    def run() -> float:
        stamp.clock = Clock()
        trainer.train()
        return stamp.clock.steps_per_s(args.skip)

    return run


def lightning_side(args: argparse.Namespace, tmp: Path, memtop: bool):
    """One LightningModule (memtop's callback or not); a fresh Trainer per fit()."""
    import lightning.pytorch as pl

    from probes.integrations.lightning import MemtopCallback

    class PLClock(pl.Callback):
        def __init__(self) -> None:
            self.clock = Clock()
            self._seen = 0

        def on_train_batch_end(self, trainer, *a, **k) -> None:
            if trainer.global_step != self._seen:  # an optimizer step ended
                self._seen = trainer.global_step
                self.clock.ends.append(time.perf_counter())

    lightning_fit = example("lightning_fit")
    module = lightning_fit.make_module(dim=args.dim)
    train, _ = lightning_fit.loaders(args.steps, args.accum, args.batch_size)

    def run() -> float:
        stamp = PLClock()
        callbacks = [stamp] + ([MemtopCallback(tmp / "memtop")] if memtop else [])
        trainer = lightning_fit.make_trainer(tmp / ("with" if memtop else "without"),
                                             steps=args.steps, accumulate=args.accum,
                                             val_every=None, callbacks=callbacks,
                                             checkpoints=False)
        trainer.fit(module, train)
        return stamp.clock.steps_per_s(args.skip)

    return run


def measure(args: argparse.Namespace) -> dict:
    make = hf_side if args.framework == "hf" else lightning_side
    with tempfile.TemporaryDirectory() as tmp:
        plain, watched = make(args, Path(tmp), False), make(args, Path(tmp), True)
        plain(), watched()  # imports, first-step work, allocator: both warm
        return run_pairs(args, "without", {"without": plain, "with": watched}, unit="steps/s",
                         fmt="8.2f", wait=False, show=args.verbose)


def options(ap) -> None:
    ap.add_argument("--framework", choices=("hf", "lightning"), default="hf")
    ap.pairs(15, "without, with, without'")
    ap.add_argument("--steps", type=int, default=60, help="optimizer steps per side")
    ap.add_argument("--skip", type=int, default=10, help="steps before the timed part")
    ap.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2, help="HF: GPT-2 blocks")
    ap.add_argument("--dim", type=int, default=128, help="model width")
    ap.quiet()
    ap.verbose()


def main(args: argparse.Namespace) -> None:
    if not 0 <= args.skip < args.steps - 1:
        raise BadInput("--skip must leave at least two timed steps")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    wait_quiet(args.max_busy, args.max_wait, "before the first round")
    pairs = in_thread(measure, args)
    name = {"hf": "HF Trainer", "lightning": "Lightning Trainer"}[args.framework]
    what = f"{name} with / without MemtopCallback, optimizer steps/s"
    row, verdict = pairs.row("with", what, TARGET)
    vals = pairs.values
    model = (f"GPT-2 ({args.layers} blocks, dim {args.dim}, vocab 256, T=32)"
             if args.framework == "hf" else f"examples/lightning_fit.py's TinyLM (dim "
                                            f"{args.dim}, T=32)")
    body = (
        f"Config: {name} on CPU, {model}, batch {args.batch_size} × {args.accum} micro-batches "
        f"per optimizer step, fp32; each side one train()/fit() of {args.steps} steps, timed "
        f"from the end of step {args.skip} to the last; {args.pairs} rounds of [without, with, "
        f"without'] (odd rounds reversed), A/A = without'/without of the same round. "
        f"{pairs.note()} Wall time {pairs.minutes:.1f} min.\n\n"
        f"{RATIO_HEADER}\n{row}\n\n"
        f"| figure | value |\n|---|---|\n"
        f"| without memtop, steps/s (median side) | {median(vals['without']):.2f} |\n"
        f"| with memtop, steps/s (median side) | {median(vals['with']):.2f} |\n"
        f"| memtop per step, from the medians | "
        f"{1000 * (1 / median(vals['with']) - 1 / median(vals['without'])):+.2f} ms |\n\n"
        f"Result: the callback's per-step cost {verdict}.")
    publish(args, f"Per-step cost of MemtopCallback ({name})", body,
            [pairs.figure(f"framework_overhead/{args.framework}", what, "with", TARGET)])
