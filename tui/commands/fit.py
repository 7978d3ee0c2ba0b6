"""``memtop fit``: the largest batch (B) and context (T) that fit a memory budget, predicted by
parts from a short probe of measured steps and, with --verify, run to prove it (README "Will it
fit?"; the math in probes/analysis/fit.py, the probe in trainer/fitprobe.py).

Exit status: 0 an answer (sizes that do not fit are a result, not a failure); 1 the probe failed
or its points made no fit; 2 bad input, before a step runs (a budget below the model's own size
or below what the process holds with torch loaded, a T over the model's context); 3 the budget
left no answer (the smallest point measured over it: nothing fits); 130 / 143 / 129 interrupted
(fit.json keeps the points measured so far).
"""

from __future__ import annotations

import argparse
import shlex

from probes.analysis.fit import DEFAULT_HEADROOM_PCT
from probes.analysis.fit_plan import VARY, model_size_problem
from trainer.config import TrainConfig
from tui.commands.argtypes import UsageError, option_default, size_arg, typed_options
from tui.commands.train import add_model_options, held_problem


def pct_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < 100:
        raise argparse.ArgumentTypeError(f"{text} is not a percentage from 0 up to 100")
    return value


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fit", help="the largest batch and context that fit a memory budget, predicted from "
                    "a short probe (and --verify'd)",
        description="Run the built-in mini-GPT for a few measured steps at a handful of batch "
                    "sizes and sequence lengths, split each peak into its parts (parameters, "
                    "gradients, optimizer state, activations, temporaries, the allocator's or "
                    "heap's overhead), fit them, and print the largest B at today's T and the "
                    "largest T at today's B that fit --memory. The model options are "
                    "`memtop train`'s. Writes fit.json into a fresh run folder.")
    add_model_options(p)
    g = p.add_argument_group("the budget")
    g.add_argument("--memory", type=size_arg, default=None, metavar="SIZE",
                   help="the budget, e.g. 2GiB (default: CUDA, the device's free memory plus "
                        "what this process holds; CPU, the RAM still available plus this "
                        "process's RSS)")
    g.add_argument("--headroom", type=pct_arg, default=DEFAULT_HEADROOM_PCT, metavar="PCT",
                   help="percent of the budget left free for what a short probe cannot see "
                        "(fragmentation later in a run, a longer batch)")
    g.add_argument("--vary", choices=VARY, default="both",
                   help="batch: B = 1, 2, 4 at --seq-len; context: T = T/4, T/2, T at "
                        "--batch-size; both: the batch points and T/4, T/2 at B = 4")
    g.add_argument("--verify", action="store_true",
                   help="then run the largest B (and T) and the first size predicted over "
                        "the budget, each in a fresh process with the budget as its "
                        "--max-memory, and say whether each ran under it")
    g.add_argument("--run-dir", dest="run_dir", default=option_default(TrainConfig, "run_dir"),
                   metavar="DIR", help="folder in which a fresh <timestamp>-<id>/ run folder "
                                       "is made")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The probe's config: the model options typed, no weights saved, steps driven by the
    probe (TrainConfig.from_options: untyped options follow the typed ones)."""
    return TrainConfig.from_options(typed_options(args, TrainConfig), steps=0,
                                    warmup_steps=0, save_weights=False)


def check_budget(config: TrainConfig, memory: int | None) -> None:
    """A budget the model cannot fit in at all (ValueError, before torch is imported); on
    CPU also one at or below what the process holds with torch loaded, by `memtop train
    --max-memory`'s rule (tui/commands/train.py held_problem)."""
    if memory is None:
        return
    problem = model_size_problem(memory, config.param_count()) or held_problem(
        config, memory, "--memory")
    if problem:
        raise ValueError(problem)


def command_text(args: argparse.Namespace, config: TrainConfig) -> str:
    parts = ["memtop", "fit", "--device", config.device, "--amp", config.amp,
             "--batch-size", str(config.batch_size), "--seq-len", str(config.seq_len),
             "--block-size", str(config.block_size), "--layers", str(config.layers),
             "--heads", str(config.heads), "--dim", str(config.dim),
             "--attention", config.attention, "--vary", args.vary,
             "--headroom", f"{args.headroom:g}"]
    if args.memory is not None:
        parts += ["--memory", str(args.memory)]
    if args.verify:
        parts.append("--verify")
    return shlex.join(parts)


def run(args: argparse.Namespace) -> int:
    from probes.analysis.fit_plan import probe_grid

    try:
        config = config_from_args(args)
        grid = probe_grid(config.batch_size, config.seq_len, args.vary)
        check_budget(config, args.memory)
        device = config.device.strip().lower()
        if device.startswith("cuda") or (config.amp == "bf16" and device != "cpu"):
            config.resolve()  # the device and amp exist here (imports torch)
    except ValueError as exc:
        raise UsageError(f"memtop fit: {exc}") from None
    from probes.runfolder import RunFolderError, create_run_dir
    from tui.fit_run import FitPlan, run_fit

    try:
        run_dir = create_run_dir(config.run_dir)
    except RunFolderError as exc:
        raise UsageError(f"memtop fit: {exc}") from None
    plan = FitPlan(config=config, run_dir=run_dir, points=grid, budget_bytes=args.memory,
                   headroom_pct=args.headroom, vary=args.vary, verify=args.verify,
                   command=command_text(args, config))
    return run_fit(plan)
