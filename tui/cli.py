"""The ``memtop`` command: ``memtop train`` (dashboard or --headless) and ``memtop report``.

Bad input never shows a traceback: one line on stderr and exit status 2, before any training.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

# Quiet torch's C++ loggers before torch is imported anywhere (profiler chatter on fd 2).
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
os.environ.setdefault("KINETO_LOG_LEVEL", "5")

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input: printed as one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints usage + message; we want one line
        raise UsageError(f"{self.prog}: {message}")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _size(text: str) -> int:
    from probes.units import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="memtop",
        description="See where memory and time go while a PyTorch model trains.",
        epilog="Run `memtop train --help` for the training options.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    train = sub.add_parser(
        "train",
        help="train the built-in mini-GPT with AMP and watch it (dashboard, or --headless)",
        description="Train a small GPT on a text shipped with memtop, with mixed precision, and "
                    "sample allocated/reserved/peak memory, driver-level usage, the GradScaler "
                    "scale and tokens/s every step. Opens a terminal dashboard unless --headless.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = train.add_argument_group("mode")
    g.add_argument("--headless", action="store_true",
                   help="no dashboard: print a line every --log-every steps")
    g.add_argument("--log-every", type=_int, default=10,
                   help="headless: print one line every N steps")
    g.add_argument("--run-dir", default="runs",
                   help="folder in which a fresh <timestamp>-<id>/ run folder is made")
    g = train.add_argument_group("device and precision")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    g.add_argument("--amp", default="auto",
                   help="auto (fp16+GradScaler on CUDA, bf16 on CPU), off, bf16 or fp16")
    g = train.add_argument_group("model and data")
    g.add_argument("--batch-size", type=_int, default=16, help="sequences per step (B)")
    g.add_argument("--seq-len", type=_int, default=128, help="tokens per sequence (T)")
    g.add_argument("--block-size", type=_int, default=128,
                   help="the model's longest context; --seq-len may not exceed it")
    g.add_argument("--layers", type=_int, default=4, help="transformer blocks")
    g.add_argument("--heads", type=_int, default=4, help="attention heads")
    g.add_argument("--dim", type=_int, default=128,
                   help="model width; divisible by --heads")
    g.add_argument("--attention", default="explicit",
                   help="explicit (materialises B×heads×T×T scores) or sdpa")
    g = train.add_argument_group("training")
    g.add_argument("--steps", type=_int, default=None,
                   help="optimizer steps, 0 = until stopped (default: 300 headless, "
                        "0 in the dashboard)")
    g.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    g.add_argument("--seed", type=_int, default=1337, help="random seed")
    g.add_argument("--warmup-steps", type=_int, default=5,
                   help="steps before the peak counters are reset")
    g.add_argument("--grad-clip", type=float, default=1.0,
                   help="max gradient norm (unscaled); 0 disables clipping")
    g.add_argument("--max-memory", type=_size, default=None, metavar="SIZE",
                   help="stop cleanly before the watched counter (device allocated on CUDA, "
                        "process RSS on CPU) passes SIZE, e.g. 6GiB")
    g = train.add_argument_group("profiler window")
    g.add_argument("--profile-wait", type=_int, default=1,
                   help="steps the window waits before warming up")
    g.add_argument("--profile-warmup", type=_int, default=1,
                   help="steps traced and thrown away")
    g.add_argument("--profile-active", type=_int, default=3, help="steps recorded")
    g.add_argument("--profile-at", type=_int, action="append", default=[],
                   metavar="STEP", help="open a profiler window at STEP (repeatable)")
    g.add_argument("--profile-memory", action="store_true",
                   help="also record allocations in the profiler window")
    g.add_argument("--profile-shapes", action="store_true",
                   help="also record input shapes (the table then tells shapes apart; stopping "
                        "the profiler takes ~3x longer)")
    g = train.add_argument_group("leak demo")
    g.add_argument("--leak", default="graph",
                   help="leak kind for `l` and --leak-at: graph (keeps loss with its autograd "
                        "graph each step) or logits (keeps each step's logits on the device)")
    g.add_argument("--leak-at", type=_int, default=None, metavar="STEP",
                   help="start the leak demo at STEP")
    g.add_argument("--leak-stop-at", type=_int, default=None, metavar="STEP",
                   help="stop the leak demo (drop what it kept) at STEP")

    report = sub.add_parser("report", help="write report.md and report.json for a run folder",
                            description="Write report.md and report.json for a finished (or "
                                        "interrupted) run folder.")
    report.add_argument("run_dir", metavar="RUN_DIR", help="a runs/<timestamp>-<id>/ folder")
    return parser


def config_from_args(args: argparse.Namespace):
    """argparse namespace -> validated TrainConfig (ValueError on bad values)."""
    from trainer.config import TrainConfig

    steps = args.steps if args.steps is not None else (300 if args.headless else 0)
    return TrainConfig(
        device=args.device, amp=args.amp, batch_size=args.batch_size, seq_len=args.seq_len,
        block_size=args.block_size, layers=args.layers, heads=args.heads, dim=args.dim,
        attention=args.attention, steps=steps, lr=args.lr, seed=args.seed,
        warmup_steps=args.warmup_steps, grad_clip=args.grad_clip,
        profile_wait=args.profile_wait, profile_warmup=args.profile_warmup,
        profile_active=args.profile_active, profile_at=list(args.profile_at),
        profile_memory=args.profile_memory, profile_record_shapes=args.profile_shapes,
        leak=args.leak, leak_at=args.leak_at,
        leak_stop_at=args.leak_stop_at, max_memory_bytes=args.max_memory, run_dir=args.run_dir,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        if args.command == "report":
            from tui.report_cmd import run_report

            return run_report(args.run_dir)
        terminal = sys.stdin.isatty() and sys.stdout.isatty() and sys.stderr.isatty()
        if not args.headless and not terminal:  # Textual draws on stderr: all three must be TTYs
            raise UsageError("memtop train: no terminal here (stdin, stdout or stderr is not a "
                             "TTY); "
                             "use `memtop train --headless` for plain output")
        if args.log_every < 1:
            raise UsageError(f"memtop train: --log-every must be a positive integer, "
                             f"got {args.log_every}")
        config = config_from_args(args)
        from probes.rundir import RunDirError, create_run_dir

        try:
            run_dir = create_run_dir(config.run_dir)
        except RunDirError as exc:
            raise UsageError(f"memtop train: {exc}") from None
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:
        print(f"memtop train: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.headless:
        from tui.headless import run_headless

        return run_headless(config, run_dir, log_every=args.log_every)
    from tui.app import run_dashboard

    return run_dashboard(config, run_dir)


if __name__ == "__main__":
    sys.exit(main())
