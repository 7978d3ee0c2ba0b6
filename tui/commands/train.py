"""``memtop train``: the built-in mini-GPT with AMP, under the dashboard or ``--headless``.

Every option's default is the TrainConfig field's default (trainer/config.py), read from there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainer.choices import AMP_MODES, ATTENTION_KINDS, LEAK_KINDS
from trainer.config import TrainConfig
from tui.commands.argtypes import (
    UsageError,
    default_of,
    int_arg,
    option_default,
    size_arg,
    typed_options,
)

HEADLESS_STEPS = default_of(TrainConfig, "steps")  # the dashboard runs until stopped instead


def _opt(group: argparse._ArgumentGroup, flag: str, field: str, help: str = "", **kw) -> None:
    """An option whose default is the config field's (one definition of each default)."""
    if kw.get("type") is int_arg:
        kw.setdefault("metavar", "N")
    group.add_argument(flag, dest=field, default=option_default(TrainConfig, field), help=help,
                       **kw)


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """Model, data and precision options (shared with commands that build the same model)."""
    g = parser.add_argument_group("device and precision")
    _opt(g, "--device", "device", "auto, cpu, cuda or cuda:N", metavar="DEV")
    _opt(g, "--amp", "amp", "auto = fp16+GradScaler on CUDA; bf16 on a CPU with native bf16, "
         "else fp32 (MEMTOP_CPU_BF16=native|emulated overrides the CPU's flags)",
         choices=AMP_MODES)
    g = parser.add_argument_group("model and data")
    _opt(g, "--batch-size", "batch_size", "sequences per step (B)", type=int_arg)
    _opt(g, "--seq-len", "seq_len", "tokens per sequence (T) (default: %(default)s, at most a "
         "typed --block-size)", type=int_arg)
    _opt(g, "--block-size", "block_size", "longest context; --seq-len may not exceed it "
         "(default: %(default)s, or a typed --seq-len)", type=int_arg)
    _opt(g, "--layers", "layers", "transformer blocks", type=int_arg)
    _opt(g, "--heads", "heads", "attention heads (default: %(default)s, or the largest "
         "below it that divides a typed --dim)", type=int_arg)
    _opt(g, "--dim", "dim", "model width; divisible by --heads (default: %(default)s, or the "
         "next multiple of typed --heads)", type=int_arg)
    _opt(g, "--attention", "attention", "explicit stores B×heads×T×T scores; sdpa is fused",
         choices=ATTENTION_KINDS)
    _opt(g, "--seed", "seed", "random seed", type=int_arg)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train the built-in mini-GPT with AMP and watch it (dashboard or --headless)",
        description="Train a small GPT on a text shipped with memtop, with mixed precision, and "
                    "sample allocated/reserved/peak memory, driver-level usage, the GradScaler "
                    "scale and tokens/s every step. Opens a terminal dashboard unless --headless.")
    g = p.add_argument_group("mode")
    g.add_argument("--headless", action="store_true",
                   help="no dashboard: print a line every --log-every steps")
    g.add_argument("--log-every", type=int_arg, default=10, metavar="N",
                   help="headless: print one line every N steps")
    _opt(g, "--run-dir", "run_dir", "folder in which a fresh <timestamp>-<id>/ run folder "
         "is made", metavar="DIR")
    _opt(g, "--no-save-weights", "save_weights", "do not write weights.pt into the run "
         "folder at the end (memtop infer --weights RUN reads it)", action="store_false")
    _opt(g, "--baseline", "baseline", "a run folder to compare with: deltas live on the "
         "dashboard, a comparison in the report", metavar="RUN")
    g = p.add_argument_group("several ranks (DDP through torch.distributed.run)")
    _opt(g, "--nproc", "nproc", "ranks on this machine: one per GPU on CUDA, gloo on CPU",
         type=int_arg)
    _opt(g, "--port", "port", "rendezvous port with --nproc; 0 = a free one", type=int_arg)
    g = p.add_argument_group("Prometheus (README: Many nodes)")
    _opt(g, "--metrics-port", "metrics_port", "serve the run's counters on /metrics at this "
         "port (with --nproc: every rank's, from this process); 0 = a free one", type=int_arg)
    _opt(g, "--metrics-bind", "metrics_bind", "the address /metrics listens on; it has no "
         "authentication", metavar="ADDR")
    add_model_options(p)
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int_arg, default=None, metavar="N",
                   help=f"optimizer steps, 0 = until stopped (default: {HEADLESS_STEPS} "
                        "headless, 0 in the dashboard; more if a --profile-at or "
                        "--attribute-at window ends later)")
    _opt(g, "--lr", "lr", "AdamW learning rate", type=float, metavar="LR")
    _opt(g, "--warmup-steps", "warmup_steps", "steps before the peak counters are reset",
         type=int_arg)
    _opt(g, "--grad-clip", "grad_clip", "max gradient norm (unscaled); 0 disables clipping",
         type=float, metavar="NORM")
    _opt(g, "--max-memory", "max_memory_bytes", "stop cleanly before a watched counter "
         "(CUDA: the step's peak allocated or reserved; CPU: process RSS) would pass SIZE, "
         "e.g. 6GiB", type=size_arg, metavar="SIZE")
    _opt(g, "--memory-history", "memory_history", "CUDA: record allocations with Python "
         "stacks (µs per allocation) so an OOM snapshot shows who allocated",
         action="store_true")
    g = p.add_argument_group("profiler window")
    _opt(g, "--profile-wait", "profile_wait", "steps the window waits before warming up",
         type=int_arg)
    _opt(g, "--profile-warmup", "profile_warmup", "steps traced and thrown away", type=int_arg)
    _opt(g, "--profile-active", "profile_active", "steps recorded", type=int_arg)
    _opt(g, "--profile-at", "profile_at", "open a profiler window at STEP (repeatable)",
         type=int_arg, action="append", metavar="STEP")
    _opt(g, "--profile-memory", "profile_memory", "also record allocations in the window",
         action="store_true")
    _opt(g, "--profile-shapes", "profile_record_shapes", "also record input shapes (stopping "
         "the profiler then takes ~3x longer)", action="store_true")
    g = p.add_argument_group("memory attribution window (which module holds the memory)")
    _opt(g, "--attribute-at", "attribute_at", "open a window at STEP: one warm-up step, then "
         "the measured ones; a memory_attribution event per window (repeatable)",
         type=int_arg, action="append", metavar="STEP")
    _opt(g, "--attribute-steps", "attribute_steps", "measured steps of a window (the `a` "
         "key's too)", type=int_arg)
    g = p.add_argument_group("leak demo")
    _opt(g, "--leak", "leak", "what `l` and --leak-at leak: graph keeps loss with its "
         "autograd graph each step; logits keeps each step's logits", choices=LEAK_KINDS)
    _opt(g, "--leak-at", "leak_at", "start the leak demo at STEP", type=int_arg,
         metavar="STEP")
    _opt(g, "--leak-stop-at", "leak_stop_at", "stop the leak demo (drop what it kept) at STEP",
         type=int_arg, metavar="STEP")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """argparse namespace -> validated TrainConfig (ValueError on bad values); the options
    not typed follow the typed ones (TrainConfig.from_options)."""
    return TrainConfig.from_options(typed_options(args, TrainConfig),
                                    steps=HEADLESS_STEPS if args.headless else 0)


def check_ranks(config: TrainConfig) -> None:
    """--nproc N fits this machine: N GPUs on CUDA, a free --port (ValueError otherwise)."""
    import torch

    from trainer.launch import check_port

    if config.torch_device.type == "cuda" and config.nproc > torch.cuda.device_count():
        raise ValueError(f"--nproc {config.nproc} needs one GPU per rank, but this machine "
                         f"has {torch.cuda.device_count()}")
    check_port(config.port)


def config_needs_torch_check(config: TrainConfig) -> bool:
    """Whether resolving the device can fail: a CUDA device, or bf16 on one. auto and cpu always
    resolve (auto falls back to cpu), so they leave `import torch` to the trainer thread and the
    dashboard's frame comes up first (benchmarks/RESULTS.md: startup)."""
    device = config.device.strip().lower()
    return device.startswith("cuda") or (config.amp == "bf16" and device != "cpu")


def check_baseline(config: TrainConfig) -> None:
    """--baseline must be a readable run folder; stored absolute, so the report finds it."""
    if config.baseline is None:
        return
    from probes.analysis.baseline import load_baseline
    from probes.runfolder import RunFolderError

    try:
        load_baseline(config.baseline)
    except RunFolderError as exc:
        raise UsageError(f"memtop train: --baseline: {exc}") from None
    config.baseline = str(Path(config.baseline).resolve())


def held_problem(config: TrainConfig, limit: int | None, option: str) -> str | None:
    """One rule for a memory limit on CPU (`memtop train --max-memory`, `memtop fit
    --memory`): the process's RSS with torch loaded is what any run holds before its model,
    so a limit at or below it can never be met (the sentence why; None when it can, or where
    the limit is the device's: on CUDA it is checked against the device's counters before
    the first step, probes/monitor/guard.py). Imports torch (``auto`` resolves the device with
    it; on the CPU the run loads it anyway)."""
    from probes.counters.host import RssReader
    from probes.tools.units import format_bytes

    device = config.device.strip().lower()
    if limit is None or device not in ("cpu", "auto"):
        return None
    import torch  # noqa: F401  (what every run holds before its model)

    if device == "auto" and config.torch_device.type != "cpu":
        return None
    rss = RssReader()
    held = rss.read()
    rss.close()
    if held is None or held < limit:
        return None
    return (f"{option} {format_bytes(limit)} is below what this process already holds "
            f"(RSS {format_bytes(held)} with torch loaded, before the model): give a limit "
            "above the run's own size")


def check_max_memory(config: TrainConfig) -> None:
    """--max-memory below what the process holds with torch loaded (held_problem):
    ValueError."""
    problem = held_problem(config, config.max_memory_bytes, "--max-memory")
    if problem:
        raise ValueError(problem)


def metrics_endpoint(config: TrainConfig):  # -> probes.export.MetricsEndpoint | None
    """--metrics-port checked before the run starts (UsageError: in use, a bad address). With
    --nproc the endpoint is this process's, kept bound; a lone run's Monitor binds its own, so
    the port is only tried and freed here (port 0 is any free one: nothing to try)."""
    if config.metrics_port is None:
        return None
    from probes.export import EndpointError, MetricsEndpoint

    try:
        endpoint = MetricsEndpoint(config.metrics_port, config.metrics_bind)
    except EndpointError as exc:
        raise UsageError(f"memtop train: --metrics-port: {exc}") from None
    if config.nproc > 1:
        return endpoint
    endpoint.close()
    return None


def run(args: argparse.Namespace) -> int:
    terminal = sys.stdin.isatty() and sys.stdout.isatty() and sys.stderr.isatty()
    if not args.headless and not terminal:  # Textual draws on stderr: all three must be TTYs
        raise UsageError("memtop train: no terminal here (stdin, stdout or stderr is not a "
                         "TTY); use `memtop train --headless` for plain output")
    if args.log_every < 1:
        raise UsageError(f"memtop train: --log-every must be a positive integer, "
                         f"got {args.log_every}")
    try:
        config = config_from_args(args)
        check_baseline(config)  # before torch is imported: bad input answers at once
        check_max_memory(config)
        if config_needs_torch_check(config) or config.nproc > 1:
            config.resolve()  # the device and amp mode exist here (imports torch)
        if config.nproc > 1:
            check_ranks(config)
    except ValueError as exc:
        raise UsageError(f"memtop train: {exc}") from None
    endpoint = metrics_endpoint(config)  # bound before the run folder: a bad port makes none
    from probes.runfolder import RunFolderError, create_run_dir

    try:
        run_dir = create_run_dir(config.run_dir)
    except RunFolderError as exc:
        if endpoint is not None:
            endpoint.close()
        raise UsageError(f"memtop train: {exc}") from None
    if config.nproc > 1:
        from tui.ranks_run import run_ranks_dashboard, run_ranks_headless

        if endpoint is not None:  # one endpoint for every rank, following the run folder
            from probes.export import FolderCollector

            endpoint.serve(FolderCollector([run_dir]))
            print(f"memtop: Prometheus metrics of every rank on {endpoint.url}", flush=True)
        try:
            if args.headless:
                return run_ranks_headless(config, run_dir, log_every=args.log_every)
            return run_ranks_dashboard(config, run_dir)
        finally:
            if endpoint is not None:
                endpoint.close()
    if args.headless:
        from tui.headless import run_headless

        return run_headless(config, run_dir, log_every=args.log_every)
    from tui.dashboard_run import run_dashboard

    return run_dashboard(config, run_dir)
