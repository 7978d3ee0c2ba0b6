"""What both framework callbacks share: one public ``Monitor`` driven from a framework's hooks.

A framework calls the user's code, so a callback cannot wrap a step in ``with mon.step():``.
``StepDriver`` opens the Monitor's step at the framework's "step begins" hook and closes it at
its "step ends" hook (both on the training thread, in that order), adds up the tokens or samples
of the step's micro-batches, turns a viewer's stop into the framework's own stop flag, and
records what the framework runs between steps (an evaluation, a checkpoint save) as events the
instruments do not compare across. Everything else (run folder, counters, profiler window, leak
watch, ledger, hints, report, request socket) is the Monitor's, as for any loop.

Modules that import a framework are loaded only when asked for (probes/integrations/__init__):
``import probes`` never imports transformers or lightning.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from probes import records as R
from probes.monitor.monitor import Monitor, StepScope
from probes.records.errors import MemtopError, MonitorArgumentError, MonitorStateError
from probes.runfolder import create_run_dir

# Monitor keywords a user may pass through a callback; the rest the callback sets itself.
MONITOR_OPTIONS = frozenset({
    "warmup_steps", "profile_at", "profile_schedule", "profile_memory", "profile_record_shapes",
    "leak_watch", "ledger", "profiler", "listen", "max_memory_bytes", "flops_per_token",
    "write_report", "sinks", "extra_hooks", "non_finite", "memory_history", "metrics_port",
    "metrics_bind", "attribution", "attribute_at", "attribute_steps", "workers_sample_s"})

OUTPUTS_HINT = ("the model's outputs are kept every step (memtop's demo: a list of each "
                "step's logits, as a callback that collects predictions would); drop them, or "
                "keep .detach().cpu() copies of what you need")


class FrameworkMissing(MemtopError, ImportError):
    """The framework a callback needs is not installed (one sentence naming the extra)."""


def require(module: str, extra: str, what: str) -> Any:
    """``module`` imported, or FrameworkMissing naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise FrameworkMissing(f"{what} needs {module.split('.')[0]}, which is not installed: "
                               f"pip install 'memtop[{extra}]'") from None


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The Monitor keywords a callback passes on; a wrong name fails where the callback is
    made, not at the first step."""
    unknown = sorted(set(options) - MONITOR_OPTIONS)
    if unknown:
        raise MonitorArgumentError(
            f"unknown option {', '.join(map(repr, unknown))} for MemtopCallback; it takes "
            f"run_dir, run_folder, tokens_per_step, samples_per_step and the Monitor's "
            f"{', '.join(sorted(MONITOR_OPTIONS))}")
    return dict(options)


def plain_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with what JSON cannot hold written as text (an enum, a path, a class)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            value = str(value)
        out[str(key)] = value
    return out


def numbers(values: Mapping[str, Any], limit: int = 24) -> dict[str, float]:
    """The finite numbers among ``values`` (a framework's metrics), at most ``limit`` of them;
    a 0-d tensor is read as its value."""
    out: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                continue
            value = value.detach().float().item()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if value == value and abs(value) != float("inf"):
            out[str(key)] = float(value)
        if len(out) >= limit:
            break
    return out


def batch_counts(batch: Any) -> tuple[int | None, int | None]:
    """(tokens, samples) of one micro-batch as a framework hands it over: ``input_ids`` of a
    mapping (or ``inputs_embeds``), else the first tensor of a mapping, tuple or list. An
    integer tensor of two or more dimensions is token ids (B × T); any other tensor gives
    samples only. Shapes only: nothing is read from the device."""
    if isinstance(batch, Mapping):
        ids = batch.get("input_ids")
        if isinstance(ids, torch.Tensor) and ids.dim() >= 1:
            return ids.numel(), ids.shape[0]
        embeds = batch.get("inputs_embeds")
        if isinstance(embeds, torch.Tensor) and embeds.dim() >= 3:
            return embeds.shape[0] * embeds.shape[1], embeds.shape[0]
        first = next((v for v in batch.values() if isinstance(v, torch.Tensor)), None)
    elif isinstance(batch, (tuple, list)):
        first = next((v for v in batch if isinstance(v, torch.Tensor)), None)
    else:
        first = batch if isinstance(batch, torch.Tensor) else None
    if first is None or first.dim() == 0:
        return None, None
    ids = not (first.is_floating_point() or first.is_complex() or first.dtype == torch.bool)
    return (first.numel() if ids and first.dim() >= 2 else None), first.shape[0]


def first_tensor(output: Any) -> torch.Tensor | None:
    """The tensor a forward pass returned: a tensor, ``logits`` of an output object, or the
    first tensor of a tuple."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, Mapping):
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        return next((t for t in output if isinstance(t, torch.Tensor)), None)
    return None


def agreed_folder(base: Path, rank: int, world_size: int,
                  broadcast: Callable[[str], str] | None) -> Path | None:
    """Several ranks write one run folder: rank 0 makes it under ``base`` and ``broadcast``
    (the framework's own, once at start, never per step) hands its path to the others. None
    for a lone process (the Monitor makes its own)."""
    if world_size <= 1 or broadcast is None:
        return None
    made = str(create_run_dir(base)) if rank == 0 else ""
    return Path(broadcast(made))


class OutputsLeakDemo:
    """The leak demo a viewer's ``l`` starts in a framework's run: it keeps each step's model
    output (its logits, detached, where they were made) until ``l`` again releases them."""

    kind = "outputs"

    def __init__(self) -> None:
        self.active = False
        self.kept: list[torch.Tensor] = []

    def keep(self, output: Any) -> None:
        tensor = first_tensor(output) if self.active else None
        if tensor is not None:
            self.kept.append(tensor.detach())

    def stop(self) -> int:
        dropped, self.kept, self.active = len(self.kept), [], False
        return dropped


class StepDriver:
    """One Monitor opened by a framework callback: a step from ``begin()`` to ``end()``.

    ``framework`` names the run in config.json; ``tokens_per_step`` / ``samples_per_step``
    (fixed figures) replace the counts taken from the batches the step saw.
    """

    def __init__(self, framework: str, run_dir: str | Path | None, run_folder: str | Path | None,
                 tokens_per_step: int | None, samples_per_step: int | None,
                 options: Mapping[str, Any]) -> None:
        self.framework = framework
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.run_folder = Path(run_folder) if run_folder is not None else None
        self.tokens_per_step, self.samples_per_step = tokens_per_step, samples_per_step
        self.options = check_options(options)
        self.monitor: Monitor | None = None
        self.last_run: Path | None = None  # the run folder of the latest run, open or closed
        self.scope: StepScope | None = None
        self.demo = OutputsLeakDemo()
        self._tokens = self._samples = self._batches = 0
        self._forward_handle: Any = None
        self.mark = time.perf_counter()  # the last step boundary: what runs after it is between

    # the run ----------------------------------------------------------------------------------
    def open(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
             scaler: Any, amp: str, base: Path, rank: int, world_size: int, max_steps: int,
             config: Mapping[str, Any],
             broadcast: Callable[[str], str] | None = None) -> Monitor:
        """The Monitor over the model the framework calls and the optimizer that steps; its
        run folder under ``base`` unless the callback was given one."""
        self.close("a new training run started before the last one ended")
        folder = self.run_folder or agreed_folder(self.run_dir or base, rank, world_size,
                                                  broadcast)
        cfg = {"framework": self.framework, "steps": max_steps or None, **config}
        self.monitor = Monitor(
            model, optimizer, scaler=scaler, amp=amp, run_dir=self.run_dir or base,
            run_folder=folder, tokens_per_step=self.tokens_per_step,
            samples_per_step=self.samples_per_step, max_steps=max_steps, config=cfg,
            rank=rank if world_size > 1 else None,
            requests={"leak_start": self._leak_start, "leak_stop": self._leak_stop},
            **self.options)
        self.last_run = self.monitor.run_dir
        self._forward_handle = model.register_forward_hook(self._on_forward)
        self.mark = time.perf_counter()
        return self.monitor

    @property
    def open_step(self) -> bool:
        return self.scope is not None

    def request_attribution(self) -> None:
        """A memory attribution window from the framework's next step on (the Monitor's
        ``request_attribution``); MonitorStateError before training began."""
        mon = self.monitor
        if mon is None or mon.closed:
            raise MonitorStateError("no training run is open: a window is requested once the "
                                    "framework has begun training (on_train_begin / "
                                    "on_train_start)")
        mon.request_attribution("callback")

    def begin(self) -> None:
        """The framework starts an optimizer step (its first micro-batch)."""
        mon = self.monitor
        if mon is None or mon.closed or self.scope is not None:
            return
        self._tokens = self._samples = self._batches = 0
        self.scope = mon.step().__enter__()

    def batch(self, batch: Any = None) -> None:
        """One micro-batch of the open step, counted from what the framework handed over."""
        if self.scope is None:
            return
        self._batches += 1
        tokens, samples = batch_counts(batch)
        self._tokens += tokens or 0
        self._samples += samples or 0

    def end(self, loss: Any = None, grad_norm: Any = None, micro_batches: int | None = None) \
            -> bool:
        """The step's optimizer update is done: its row (what the framework already computed,
        no added sync). True when a viewer (or --max-memory) asked the run to stop."""
        scope, self.scope = self.scope, None
        if scope is not None:
            scope.set(loss=loss, grad_norm=grad_norm,
                      tokens=None if self.tokens_per_step else self._tokens or None,
                      samples=None if self.samples_per_step else self._samples or None,
                      micro_batches=micro_batches or self._batches or None)
            scope.__exit__(None, None, None)
        self.mark = time.perf_counter()
        return self.should_stop

    @property
    def should_stop(self) -> bool:
        mon = self.monitor
        return mon is not None and not mon.closed and mon.should_stop

    def mark_now(self) -> None:
        """Something between steps starts now (its seconds are counted from here)."""
        self.mark = time.perf_counter()

    def between(self, kind: str, data: dict[str, Any]) -> None:
        """An evaluation or a checkpoint save ran since the last step boundary (``mark``)."""
        mon = self.monitor
        if mon is None or mon.closed:
            return
        now = time.perf_counter()
        data.setdefault("seconds", round(now - self.mark, 4))
        data.setdefault("source", self.framework)
        mon.between_steps(kind, data)
        self.mark = now

    def fail(self, error: BaseException) -> None:
        """The framework's step raised: the step's error row, then the run's close."""
        scope, self.scope = self.scope, None
        if scope is not None:
            with contextlib.suppress(Exception):
                scope.__exit__(type(error), error, error.__traceback__)
        if isinstance(error, KeyboardInterrupt):
            self.close("interrupted (KeyboardInterrupt)")
        else:
            self.close(error=error if isinstance(error, Exception) else None)

    def close(self, reason: str | None = None, error: BaseException | None = None) -> None:
        """run_finished and the report; a step left open (the framework never ended it) is
        closed as it stands first."""
        mon, self.monitor = self.monitor, None
        if mon is None:
            return
        if self.scope is not None:
            self.end()
        if self._forward_handle is not None:
            self._forward_handle.remove()
            self._forward_handle = None
        self.demo.stop()
        mon.close(reason=reason, error=error)

    # the leak demo (a viewer's l) -------------------------------------------------------------
    def _on_forward(self, module: Any, inputs: Any, output: Any) -> None:
        if self.demo.active and self.scope is not None:
            self.demo.keep(output)

    def _leak_start(self, step: int) -> None:
        mon = self.monitor
        if mon is not None and not self.demo.active:
            self.demo.active = mon.leak_active = True
            mon.emit(R.LEAK_DEMO_STARTED, step, {"kind": self.demo.kind, "hint": OUTPUTS_HINT})

    def _leak_stop(self, step: int) -> None:
        mon = self.monitor
        if mon is not None and self.demo.active:
            dropped = self.demo.stop()
            mon.leak_active = False
            mon.emit(R.LEAK_DEMO_STOPPED, step, {"kind": self.demo.kind,
                                                 "released_tensors": dropped})
