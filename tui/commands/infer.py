"""``memtop infer``: generation with a KV cache, prefill and decode measured apart.

Every option's default is the InferConfig field's default (trainer/infer_config.py).
"""

from __future__ import annotations

import argparse
import sys

from trainer.choices import AMP_MODES, ATTENTION_KINDS
from trainer.infer_config import PROFILE_PHASES, InferConfig
from tui.commands.argtypes import (
    UsageError,
    int_arg,
    option_default,
    size_arg,
    typed_options,
)


def _opt(group: argparse._ArgumentGroup, flag: str, field: str, help: str = "", **kw) -> None:
    if kw.get("type") is int_arg:
        kw.setdefault("metavar", "N")
    group.add_argument(flag, dest=field, default=option_default(InferConfig, field), help=help,
                       **kw)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "infer", help="generate with a KV cache; prefill and decode measured apart",
        description="Generate text with the mini-GPT over a KV cache: each request prefills B "
                    "prompts, then decodes one token per step. Every step records its phase, "
                    "time and the cache's bytes beside 2 x layers x B x T x dim x bytes. The "
                    "model runs under eval(), inference_mode and no GradScaler.")
    g = p.add_argument_group("mode")
    g.add_argument("--headless", action="store_true",
                   help="no dashboard: print a line per prefill and every --log-every decodes")
    g.add_argument("--log-every", type=int_arg, default=16, metavar="N",
                   help="headless: print one line every N decode steps")
    _opt(g, "--run-dir", "run_dir", "folder in which a fresh <timestamp>-<id>/ run folder "
         "is made", metavar="DIR")
    g = p.add_argument_group("model")
    _opt(g, "--weights", "weights", "a `memtop train` run folder or its weights.pt "
         "(default: a freshly initialised model, with a warning)", metavar="RUN")
    _opt(g, "--device", "device", "auto, cpu, cuda or cuda:N", metavar="DEV")
    _opt(g, "--amp", "amp", "auto = fp16 on CUDA; bf16 on a CPU with native bf16, else fp32",
         choices=AMP_MODES)
    for flag, field, what in (("--layers", "layers", "transformer blocks"),
                              ("--heads", "heads", "attention heads"),
                              ("--dim", "dim", "model width"),
                              ("--block-size", "block_size", "longest context")):
        _opt(g, flag, field, f"{what} of a fresh model (default: the weights', else memtop "
             "train's, which follow each other as there; a fresh block holds --prompt-len + "
             "--new-tokens)" if field == "block_size" else f"{what} of a fresh model (default: "
             "the weights', else memtop train's, which follow each other as there)",
             type=int_arg)
    _opt(g, "--attention", "attention", "explicit or sdpa (default: the weights', else "
         "explicit)", choices=ATTENTION_KINDS)
    g = p.add_argument_group("requests")
    _opt(g, "--batch-size", "batch_size", "concurrent sequences per request (B)", type=int_arg)
    _opt(g, "--prompt-len", "prompt_len", "prompt tokens per sequence (default: %(default)s, "
         "at most half a typed --block-size or the weights')", type=int_arg)
    _opt(g, "--new-tokens", "new_tokens", "tokens generated per sequence (default: "
         "%(default)s, at most what the block leaves after the prompt)", type=int_arg)
    _opt(g, "--requests", "requests", "rounds of B sequences; the first is the warm-up",
         type=int_arg)
    _opt(g, "--top-k", "top_k", "0 = greedy, else sample among the k likeliest",
         type=int_arg)
    _opt(g, "--temperature", "temperature", "softmax temperature for --top-k", type=float,
         metavar="T")
    _opt(g, "--seed", "seed", "random seed (prompts, init, sampling)", type=int_arg)
    _opt(g, "--baseline-tokens", "baseline_tokens", "tokens made with and without the cache "
         "at the end, to measure its trade; 0 skips (default: %(default)s, at most "
         "--new-tokens)", type=int_arg)
    _opt(g, "--max-memory", "max_memory_bytes", "the admission budget, e.g. 6GiB (default: "
         "device memory, or host RAM on CPU)", type=size_arg, metavar="SIZE")
    g = p.add_argument_group("profiler windows")
    _opt(g, "--profile-phase", "profile_phase", "which phase gets a profiler window, in "
         "request 2 (request 1 warms up); auto (the default) = both, but none with --requests "
         "1; a phase asked for with --requests 1 is profiled in the only request, whose TTFT "
         "and decode times then carry the profiler", choices=PROFILE_PHASES)
    _opt(g, "--profile-active", "profile_active", "decode steps the decode window records",
         type=int_arg)
    g = p.add_argument_group("memory window")
    _opt(g, "--attribute-request", "attribute_request", "a memory window in request N: per "
         "module, the KV cache it keeps and its forward peak in that request's prefill and "
         "first decode step (not request 1, the warm-up, nor the profiled one; default: only "
         "on the a key)", type=int_arg, metavar="N")


def config_from_args(args: argparse.Namespace) -> InferConfig:
    return InferConfig.from_options(typed_options(args, InferConfig))


def run(args: argparse.Namespace) -> int:
    if args.log_every < 1:
        raise UsageError(f"memtop infer: --log-every must be a positive integer, "
                         f"got {args.log_every}")
    if not args.headless:
        terminal = sys.stdin.isatty() and sys.stdout.isatty() and sys.stderr.isatty()
        if not terminal:
            raise UsageError("memtop infer: no terminal here (stdin, stdout or stderr is not a "
                             "TTY); use `memtop infer --headless` for plain output")
    try:
        config = config_from_args(args)
        config.resolve()
        from trainer.infer_config import prepare_model

        spec = prepare_model(config)
    except ValueError as exc:  # CheckpointError and RunFolderError are ValueErrors too
        raise UsageError(f"memtop infer: {exc}") from None
    from probes.runfolder import RunFolderError, create_run_dir

    try:
        run_dir = create_run_dir(config.run_dir)
    except RunFolderError as exc:
        raise UsageError(f"memtop infer: {exc}") from None
    if spec.warning:
        print(f"memtop infer: warning: {spec.warning}", file=sys.stderr, flush=True)
    if args.headless:
        from tui.headless_infer import run_infer_headless

        return run_infer_headless(config, spec, run_dir, log_every=args.log_every)
    from tui.dashboard_run import run_infer_dashboard

    return run_infer_dashboard(config, spec, run_dir)
