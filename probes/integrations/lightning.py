"""memtop in a PyTorch Lightning ``Trainer``: one line.

    from probes.integrations.lightning import MemtopCallback

    trainer = lightning.Trainer(max_steps=1000, callbacks=[MemtopCallback()])
    trainer.fit(module, loader)          # memtop view ROOT_DIR/memtop  (in another terminal)

The run folder (``trainer.default_root_dir/memtop/<time>-<id>/`` unless ``run_dir`` or
``run_folder`` is given), counters, profiler window, leak watch, ledger, hints and report are a
``probes.Monitor``'s (probes/integrations/common.py drives it). How Lightning's loop maps onto
memtop's steps:

- one memtop step per optimizer step: it opens at ``on_train_batch_start`` of its first
  micro-batch and ends at the ``on_train_batch_end`` that follows ``on_before_optimizer_step``,
  so ``accumulate_grad_batches`` micro-batches count once, with all their tokens (integer ids
  of B × T in the batch) or samples;
- the loss is the sum of the (accumulation-normalised) losses Lightning hands to
  ``on_before_backward``: the step's mean loss, read with the step's other values at one
  wait, as any Monitor loop's;
- the monitored model is the LightningModule (the root: every submodule, parameter and hook
  is under it); micro-batches are counted from the batches, since Lightning may call the
  module's ``forward`` once, twice (DDP's redirection) or never per batch;
- amp from the precision plugin (``bf16-mixed``, ``16-mixed`` with its GradScaler);
- validation and checkpoint saving between steps: ``evaluate`` and ``save`` events, and the
  leak watch does not compare the steps across them;
- a viewer's ``x`` sets ``trainer.should_stop``: ``fit()`` returns normally after that step;
- ``on_exception`` records the error row; under DDP every rank writes metrics-rank-K.jsonl into
  one folder (rank 0 makes it; the strategy's broadcast hands its path over once).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from probes import records as R
from probes.integrations.common import StepDriver, numbers, plain_values, require

_pl = require("lightning.pytorch", "lightning", "probes.integrations.lightning")

__all__ = ["MemtopCallback", "amp_of"]


def amp_of(precision: Any) -> str:
    """memtop's amp name for a Lightning precision ("bf16-mixed" -> "bf16", "16-mixed" ->
    "fp16"); a "-true" precision is no autocast ("off": its parameters are in that dtype)."""
    text = str(precision)
    if text in ("bf16-mixed", "bf16"):
        return "bf16"
    if text in ("16-mixed", "16"):
        return "fp16"
    return "off"


class MemtopCallback(_pl.Callback):
    """memtop for ``lightning.Trainer(callbacks=[MemtopCallback()])``; see the module
    docstring. ``run_dir`` (default ``trainer.default_root_dir/memtop``) gets a fresh run
    folder per ``fit()``; ``run_folder`` is that exact folder; ``tokens_per_step`` /
    ``samples_per_step`` replace the counts taken from the batches; any other keyword is the
    Monitor's (``warmup_steps``, ``profile_at``, ``attribute_at``, ``max_memory_bytes``,
    ``leak_watch``, ...)."""

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, *,
                 run_folder: str | os.PathLike[str] | None = None,
                 tokens_per_step: int | None = None, samples_per_step: int | None = None,
                 **monitor_options: Any) -> None:
        self.driver = StepDriver("lightning", run_dir, run_folder, tokens_per_step,
                                 samples_per_step, monitor_options)
        self._loss: torch.Tensor | None = None
        self._stepped = False

    @property
    def monitor(self) -> Any:
        """The Monitor of the run in progress (None outside ``fit()``)."""
        return self.driver.monitor

    def request_attribution(self) -> None:
        """A memory attribution window from the next optimizer step on (``a`` in a viewer, or
        ``attribute_at=[STEP]`` given to the callback, do the same); only during ``fit()``."""
        self.driver.request_attribution()

    # the run ----------------------------------------------------------------------------------
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        optimizers = list(trainer.optimizers)
        if not optimizers:
            return  # nothing steps: nothing to watch
        plugin = trainer.precision_plugin
        scaler = getattr(plugin, "scaler", None)
        config = {"trainer": plain_values({
                      "precision": trainer.precision, "max_steps": trainer.max_steps,
                      "max_epochs": trainer.max_epochs,
                      "accumulate_grad_batches": trainer.accumulate_grad_batches,
                      "strategy": type(trainer.strategy).__name__,
                      "world_size": trainer.world_size,
                      "default_root_dir": trainer.default_root_dir}),
                  "lightning_version": _pl.__version__,
                  "hparams": plain_values(dict(getattr(pl_module, "hparams", {}) or {}))}
        world = max(1, int(trainer.world_size))
        self.driver.open(
            pl_module, optimizers[0],
            scaler=scaler if isinstance(scaler, torch.amp.GradScaler) else None,
            amp=amp_of(trainer.precision),
            base=Path(trainer.default_root_dir or ".") / "memtop", rank=int(trainer.global_rank),
            world_size=world, max_steps=max(0, int(trainer.max_steps or 0)), config=config,
            broadcast=(lambda path: str(trainer.strategy.broadcast(path, src=0)))
            if world > 1 else None)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        if not self.driver.open_step:
            self._loss, self._stepped = None, False
            self.driver.begin()
        self.driver.batch(batch)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: torch.Tensor) -> None:
        if not self.driver.open_step:
            return
        monitor = self.driver.monitor
        if monitor is not None:
            monitor.memory.observe_peak(budgeted=True)  # the activations' peak, as the
            # Monitor's own forward hook reads it (CPU: while it costs ≤ 0.2% of a step)
        value = loss.detach()
        self._loss = value if self._loss is None else self._loss + value  # no sync: on device

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._stepped = True

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not (self.driver.open_step and self._stepped):
            return  # an accumulating micro-batch: the step goes on
        loss, self._loss, self._stepped = self._loss, None, False
        if self.driver.end(loss=loss):
            trainer.should_stop = True  # a viewer's x: Lightning's own stop after this step

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.driver.mark_now()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        self.driver.between(R.EVALUATE, {"metrics": numbers(dict(trainer.callback_metrics))})

    def on_save_checkpoint(self, trainer: Any, pl_module: Any,
                           checkpoint: dict[str, Any]) -> None:
        self.driver.between(R.SAVE, {"seconds": None})  # written after this hook returns

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.driver.fail(exception)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.driver.close()
