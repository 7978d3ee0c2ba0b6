"""What a Monitor needs before its first step: its arguments checked (one sentence per mistake),
its run folder, its instruments, and what the environment says (rank, world size, autocast).
Kept apart from probes/monitor/monitor.py so the class there reads as the loop sees it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from probes.instruments.hooks import StepHook
from probes.records.errors import MonitorArgumentError
from probes.runfolder import RunFolderError, create_run_dir


def check_args(model: Any, optimizer: Any, scaler: Any, tokens: Any, samples: Any, amp: Any,
                warmup: Any, max_steps: Any) -> torch.device:
    if not isinstance(model, torch.nn.Module):
        raise MonitorArgumentError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise MonitorArgumentError("optimizer must be a torch.optim.Optimizer, got "
                                   f"{type(optimizer).__name__}")
    params = list(model.parameters())
    if not params:
        raise MonitorArgumentError("the model has no parameters to train")
    mine = {id(p) for p in params}
    theirs = [p for g in optimizer.param_groups for p in g["params"]]
    if theirs and not any(id(p) in mine for p in theirs):
        raise MonitorArgumentError("the optimizer updates none of this model's parameters: "
                                   "pass the optimizer built from model.parameters()")
    if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
        raise MonitorArgumentError(f"scaler must be a torch.amp.GradScaler, got "
                                   f"{type(scaler).__name__}")
    for name, value in (("tokens_per_step", tokens), ("samples_per_step", samples)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value <= 0):
            raise MonitorArgumentError(f"{name} must be a positive integer, got {value!r}")
    if amp is not None and amp not in ("off", "bf16", "fp16"):
        raise MonitorArgumentError(f"amp must be 'off', 'bf16' or 'fp16', got {amp!r}")
    for name, value in (("warmup_steps", warmup), ("max_steps", max_steps)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise MonitorArgumentError(f"{name} must be zero or a positive integer, got "
                                       f"{value!r}")
    return params[0].device


def make_folder(run_dir: Any, run_folder: Any) -> Path:
    if run_folder is None:
        return create_run_dir(run_dir)
    path = Path(run_folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunFolderError(f"cannot create run folder {path}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise RunFolderError(f"run folder {path} is not writable")
    return path


def default_hooks(*, profiler: bool = True, profile_schedule: tuple[int, int, int] = (1, 1, 3),
                  profile_at: Iterable[int] = (), profile_memory: bool = False,
                  profile_record_shapes: bool = False, leak_watch: bool = True,
                  ledger: bool = True, attribution: bool = True,
                  attribute_at: Iterable[int] = (), attribute_steps: int = 1,
                  extra: Iterable[StepHook] = ()) -> list[StepHook]:
    """Profiler window, memory attribution window, leak detector, ``extra`` and the memory
    ledger, in the order they see each step (the attribution window's hooks go on before the
    ledger decides whether to measure: it leaves a window's steps alone)."""
    hooks: list[StepHook] = []
    if profiler:
        from probes.instruments.profwindow import ProfilerWindow

        wait, warmup, active = profile_schedule
        hooks.append(ProfilerWindow(wait, warmup, active, at_steps=list(profile_at),
                                    profile_memory=profile_memory,
                                    record_shapes=profile_record_shapes))
    if attribution:
        from probes.instruments.attribution import MemoryAttribution

        hooks.append(MemoryAttribution(attribute_steps, at_steps=list(attribute_at)))
    if leak_watch:
        from probes.instruments.culprits.finder import CulpritFinder
        from probes.instruments.leakwatch import LeakWatch

        watch = LeakWatch()
        hooks += [watch, CulpritFinder(watch)]  # the finder looks when the watch alerts
    hooks.extend(extra)
    if ledger:
        from probes.instruments.ledger import Ledger

        hooks.append(Ledger())  # last: sees each step after the others
    return hooks


def autocast_mode(device: torch.device) -> str | None:
    try:
        if not torch.is_autocast_enabled(device.type):
            return "off"
        dtype = torch.get_autocast_dtype(device.type)
    except (AttributeError, RuntimeError, TypeError):
        return None
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def env_rank() -> int | None:
    """This process's rank when torchrun (or another launcher) started several."""
    if env_world_size() > 1:
        with contextlib.suppress(ValueError):
            return int(os.environ.get("RANK", "0"))
    return None


def env_local_rank() -> int:
    """This process's rank on its own machine under torchrun (LOCAL_RANK); 0 when alone."""
    try:
        return max(0, int(os.environ.get("LOCAL_RANK", "0")))
    except ValueError:
        return 0


def metrics_endpoint(port: int | None, bind: str) -> Any:
    """The bound (not yet serving) /metrics endpoint of ``Monitor(metrics_port=...)``: None
    when no port is asked, or on a machine's ranks but local rank 0 (one endpoint per node
    serves every local rank: probes/export). MonitorArgumentError when it cannot be served."""
    if port is None or env_local_rank() != 0:
        return None
    from probes.export import EndpointError, MetricsEndpoint

    try:
        return MetricsEndpoint(port, bind)
    except EndpointError as exc:
        raise MonitorArgumentError(f"metrics_port: {exc}") from None


def env_world_size() -> int:
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1
