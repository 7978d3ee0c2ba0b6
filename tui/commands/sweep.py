"""``memtop sweep``: peak memory and speed over a grid of batch sizes × sequence lengths (and
optionally attention, amp, width, depth), each cell a fresh `memtop train --headless` process
(tutorial exercise 6). Writes sweep.json, sweep.csv and sweep.md into a fresh sweep folder.

Exit status: 0 done (OOM or failed cells are recorded, not fatal); 2 bad input, before any cell
runs; 130 interrupted (finished cells kept, the rest listed as not run).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from trainer.config import TrainConfig
from tui.commands.argtypes import UsageError, default_of, int_arg, size_arg

if TYPE_CHECKING:
    from tui.sweep_runner import SweepPlan


def _default(name: str) -> str:
    return str(default_of(TrainConfig, name))


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="peak memory and tokens/s over a B×T grid, one process "
                                     "per cell",
                       description="Run the built-in mini-GPT for every combination of the "
                                   "comma lists below, each cell in a fresh process, one at a "
                                   "time: warmup, then --steps measured steps. Records peak "
                                   "allocated/reserved, tokens/s p50 and step p50/p95, fits "
                                   "peak = a + b·T + c·T² per series and draws it.")
    g = p.add_argument_group("grid (comma lists)")
    g.add_argument("--batch-size", default=_default("batch_size"), metavar="LIST",
                   help="batch sizes B, e.g. 1,4,8")
    g.add_argument("--seq-len", default=_default("seq_len"), metavar="LIST",
                   help="sequence lengths T, e.g. 128,256,512")
    g.add_argument("--attention", default=_default("attention"), metavar="LIST",
                   help="explicit and/or sdpa, e.g. explicit,sdpa")
    g.add_argument("--amp", default=_default("amp"), metavar="LIST",
                   help="amp modes {auto,off,bf16,fp16}, e.g. off,bf16")
    g.add_argument("--dim", default=_default("dim"), metavar="LIST", help="model widths")
    g.add_argument("--layers", default=_default("layers"), metavar="LIST",
                   help="transformer blocks")
    g = p.add_argument_group("every cell")
    g.add_argument("--device", default=_default("device"), metavar="DEV",
                   help="auto, cpu, cuda or cuda:N")
    g.add_argument("--steps", type=int_arg, default=20, metavar="N",
                   help="measured steps per cell, after the warmup")
    g.add_argument("--warmup-steps", type=int_arg, default=default_of(TrainConfig,
                                                                     "warmup_steps"),
                   metavar="N", help="steps before the peaks reset and timing starts")
    g.add_argument("--heads", type=int_arg, default=None, metavar="N",
                   help=f"attention heads (default: {default_of(TrainConfig, 'heads')}, or the "
                        "largest below it that divides each --dim)")
    g.add_argument("--block-size", type=int_arg, default=None, metavar="N",
                   help="the model's longest context (default: the largest of --seq-len "
                        f"and {default_of(TrainConfig, 'block_size')})")
    g.add_argument("--seed", type=int_arg, default=default_of(TrainConfig, "seed"),
                   metavar="N", help="random seed")
    g.add_argument("--max-memory", type=size_arg, default=None, metavar="SIZE",
                   help="a cell whose watched counter would pass SIZE stops and counts as OOM")
    g.add_argument("--out", default="sweeps", metavar="DIR",
                   help="folder in which a fresh <timestamp>-<id>/ sweep folder is made")


def command_text(args: argparse.Namespace) -> str:
    """The sweep as a command line, every setting spelled out (for sweep.md)."""
    import shlex

    parts = ["memtop", "sweep"]
    for flag in ("batch_size", "seq_len", "attention", "amp", "dim", "layers", "device",
                 "steps", "warmup_steps", "heads", "block_size", "seed", "max_memory"):
        value = getattr(args, flag)
        if value is not None:
            parts += ["--" + flag.replace("_", "-"), str(value)]
    return shlex.join(parts)


def plan_from_args(args: argparse.Namespace) -> SweepPlan:
    """Validated cells and settings; ValueError (one sentence) on any bad value, before any
    cell runs."""
    from probes.analysis.sweep import grid, parse_list
    from tui.sweep_runner import SweepPlan

    axes = {"batch_size": parse_list(args.batch_size, "--batch-size"),
            "seq_len": parse_list(args.seq_len, "--seq-len"),
            "attention": parse_list(args.attention, "--attention", str),
            "amp": parse_list(args.amp, "--amp", str),
            "dim": parse_list(args.dim, "--dim"),
            "layers": parse_list(args.layers, "--layers")}
    if args.steps < 1:
        raise ValueError(f"--steps must be a positive integer, got {args.steps}")
    block = args.block_size or max(max(axes["seq_len"]), default_of(TrainConfig, "block_size"))
    cells = grid(axes)
    for cell in cells:  # every cell must be a valid run: refuse now, not after an hour
        heads = {} if args.heads is None else {"heads": args.heads}  # else it follows --dim
        config = TrainConfig.from_options(dict(
            device=args.device, amp=cell.amp, batch_size=cell.batch_size,
            seq_len=cell.seq_len, block_size=block, layers=cell.layers, dim=cell.dim,
            attention=cell.attention, steps=args.warmup_steps + args.steps,
            warmup_steps=args.warmup_steps, seed=args.seed, max_memory_bytes=args.max_memory,
            **heads))
    if config.device.strip().lower() != "cpu":  # cpu is always here; else import torch, ask
        for amp in axes["amp"]:
            TrainConfig(device=args.device, amp=amp).resolve()
    return SweepPlan(cells=cells, device=args.device,
                     warmup_steps=args.warmup_steps, steps=args.steps, heads=args.heads,
                     block_size=block, seed=args.seed, max_memory_bytes=args.max_memory,
                     command=command_text(args),
                     extra={"axes": axes})


def run(args: argparse.Namespace) -> int:
    from probes.runfolder import RunFolderError, create_run_dir
    from tui.charts import sweep_charts
    from tui.sweep_runner import run_sweep

    try:
        plan = plan_from_args(args)
    except ValueError as exc:
        raise UsageError(f"memtop sweep: {exc}") from None
    try:
        plan.folder = create_run_dir(args.out)
    except RunFolderError as exc:
        raise UsageError(f"memtop sweep: {exc}") from None
    code, _ = run_sweep(plan, charts=sweep_charts)
    return code
