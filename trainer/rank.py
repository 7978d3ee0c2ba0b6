"""One rank of ``memtop train --nproc N``: what torch.distributed.run starts in each process.

    python -m torch.distributed.run --standalone --nproc-per-node N \\
        -m trainer.rank --run-folder RUN --config '{...}'

The launcher (trainer/launch.py, or your own ``torchrun`` on each node) makes the run folder and
passes its path; every rank writes its own metrics-rank-K.jsonl there and rank 0 writes config.json
(probes/runfolder/recorder.py). The process group is gloo on CPU and NCCL on CUDA (one GPU per local
rank); the model is wrapped in DistributedDataParallel. Requests reach each rank through its own
socket; several ranks act on them at the same future step (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1
# after torchrun's SIGTERM, a step still in flight this long waits on a collective that will
# never finish (torchrun's agent sends SIGKILL 30 s after its SIGTERM)
STUCK_AFTER_SIGNAL_S = 12.0


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``sig`` when the parent (torchrun's agent) dies: no orphan ranks."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.rank",
                                     description="One DDP rank of memtop's trainer (started "
                                                 "by torch.distributed.run).")
    parser.add_argument("--run-folder", required=True, help="the run folder all ranks share")
    parser.add_argument("--config", required=True, help="the run's options as JSON "
                                                        "(TrainConfig.to_json)")
    args = parser.parse_args(argv)
    die_with_parent()
    from trainer.config import TrainConfig

    try:
        config = TrainConfig.from_json(json.loads(args.config))
    except ValueError as exc:
        print(f"memtop rank: bad --config: {exc}", file=sys.stderr)
        return 2
    run_dir = Path(args.run_folder)
    rank, local = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    world = _env_int("WORLD_SIZE", 1)

    import torch
    import torch.distributed as dist

    from probes.control.requests import RunControl
    from probes.monitor import default_hooks
    from trainer.loop import Trainer

    want = config.device.strip().lower()
    cuda = want.startswith("cuda") or (want == "auto" and torch.cuda.is_available())
    device = torch.device(f"cuda:{local}") if cuda else torch.device("cpu")
    control = RunControl()
    signals = _stop_on_signals(control)
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo")
    try:
        trainer = Trainer(config, run_dir, control=control,
                          hooks=default_hooks(**config.hook_options()),
                          rank=rank if world > 1 else None, device=device, ddp=world > 1)
        trainer.start()
        signalled_at: float | None = None
        while not trainer.join(timeout=0.2):
            if signals and signalled_at is None:
                signalled_at = time.monotonic()
            step = trainer.step_in_flight
            if signalled_at is not None and step is not None \
                    and time.monotonic() - signalled_at > STUCK_AFTER_SIGNAL_S:
                _leave_stuck(trainer, step, signals)
        code = 1 if trainer.exit_code is None else trainer.exit_code
    finally:
        if world > 1 and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
    return code


def _leave_stuck(trainer: Any, step: int, signals: list[int]) -> None:
    """torchrun's agent ends this rank (a peer rank ended) while its step waits in a collective
    that gloo does not always abandon when the peer dies: the step never reaches the boundary
    where the stop would act, and the agent's SIGKILL 30 s later would leave the file without
    its end. Seal it as failed, with why, and leave at once (the training thread never returns:
    no teardown of the process group, which would wait for it too)."""
    name = signal.Signals(signals[0]).name
    trainer.abandon(f"interrupted ({name})", stuck=(
        f"step {step} never finished: {STUCK_AFTER_SIGNAL_S:.0f} s after {name} it was still "
        "inside the step, waiting on a collective (another rank ended)"))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def _stop_on_signals(control: object) -> list[int]:
    """SIGTERM/SIGINT (torchrun's agent ending the workers): stop at the next boundary; a
    second one leaves at once (every finished row is on disk). Returns the signals received
    (filled as they come; empty off the main thread, where none can be handled)."""
    seen: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        return seen

    def handler(signum: int, _frame: object) -> None:
        seen.append(signum)
        if len(seen) > 1:
            raise KeyboardInterrupt
        control.stop(f"interrupted ({signal.Signals(signum).name})")  # type: ignore[attr-defined]

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)
    return seen


if __name__ == "__main__":
    sys.exit(main())
