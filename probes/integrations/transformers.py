"""memtop in a Hugging Face ``Trainer``: one line.

    from probes.integrations.transformers import MemtopCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[MemtopCallback()])
    trainer.train()                      # memtop view OUTPUT_DIR/memtop  (in another terminal)

The run folder (``args.output_dir/memtop/<time>-<id>/`` unless ``run_dir`` or ``run_folder`` is
given), counters, profiler window, leak watch, ledger, hints and report are a ``probes.Monitor``'s
(probes/integrations/common.py drives it). How HF's loop maps onto memtop's steps:

- one memtop step per optimizer step, from ``on_step_begin`` (HF has fetched all the step's
  micro-batches by then) to ``on_step_end``; with gradient accumulation every micro-batch is
  inside it, and the tokens (``input_ids`` of each forward, or samples) of all of them count;
- the loss and gradient norm are the ones HF logs (``on_log``), on the row of the step HF
  logged them at: HF reads its loss only then, so memtop adds no device sync. A logging step's
  row therefore ends after HF's log; with ``logging_steps=k`` its loss is HF's mean over the
  last k steps and the other rows have none;
- amp from ``args.bf16`` / ``args.fp16``; the GradScaler accelerate made for fp16; the model HF
  calls (accelerate may wrap it: its forward hooks still fire) and the optimizer inside
  accelerate's wrapper, which is the one that steps;
- evaluation and checkpoint saving run between steps: ``evaluate`` and ``save`` events, never
  inside a step's time, and the leak watch does not compare the steps across them;
- a viewer's ``x`` sets ``control.should_training_stop`` (and ``should_save`` unless
  ``save_strategy="no"``, as HF does at its last step): ``train()`` returns as it normally does;
- under torchrun / accelerate every rank writes its own metrics-rank-K.jsonl into one folder
  (rank 0 makes it and hands its path over once, at the start), rank 0 writes config.json with
  the TrainingArguments.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from probes import records as R
from probes.integrations.common import StepDriver, numbers, plain_values, require

_tf = require("transformers", "transformers", "probes.integrations.transformers")
TrainerCallback = _tf.TrainerCallback

__all__ = ["MemtopCallback"]


def amp_of(args: Any) -> str:
    """The autocast precision HF (accelerate) trains in, from its TrainingArguments."""
    if getattr(args, "bf16", False):
        return "bf16"
    if getattr(args, "fp16", False):
        return "fp16"
    return "off"


def inner_optimizer(optimizer: Any) -> tuple[torch.optim.Optimizer, Any]:
    """(the torch optimizer that steps, accelerate's GradScaler or None): accelerate wraps the
    optimizer in an AcceleratedOptimizer whose ``.optimizer`` is the real one."""
    scaler = getattr(optimizer, "scaler", None)
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, torch.optim.Optimizer):
        optimizer = inner
    return optimizer, scaler if isinstance(scaler, torch.amp.GradScaler) else None


class MemtopCallback(TrainerCallback):
    """memtop for ``transformers.Trainer(callbacks=[MemtopCallback()])``; see the module
    docstring. ``run_dir`` (default ``args.output_dir/memtop``) gets a fresh run folder per
    ``train()``; ``run_folder`` is that exact folder; ``tokens_per_step`` / ``samples_per_step``
    replace the counts taken from each forward's ``input_ids``; any other keyword is the
    Monitor's (``warmup_steps``, ``profile_at``, ``attribute_at``, ``max_memory_bytes``,
    ``leak_watch``, ...)."""

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, *,
                 run_folder: str | os.PathLike[str] | None = None,
                 tokens_per_step: int | None = None, samples_per_step: int | None = None,
                 **monitor_options: Any) -> None:
        self.driver = StepDriver("transformers", run_dir, run_folder, tokens_per_step,
                                 samples_per_step, monitor_options)
        self._close_after_log = False
        self._pre_hook: Any = None

    @property
    def monitor(self) -> Any:
        """The Monitor of the run in progress (None outside ``train()``)."""
        return self.driver.monitor

    def request_attribution(self) -> None:
        """A memory attribution window from the next optimizer step on (``a`` in a viewer, or
        ``attribute_at=[STEP]`` given to the callback, do the same); only during ``train()``."""
        self.driver.request_attribution()

    # the run ----------------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       optimizer: Any = None, **kwargs: Any) -> None:
        if model is None or optimizer is None:
            return
        torch_optimizer, scaler = inner_optimizer(optimizer)
        world = max(1, int(getattr(args, "world_size", 1) or 1))
        rank = int(getattr(args, "process_index", 0) or 0)
        config = {"training_arguments": plain_values(args.to_dict()),
                  "transformers_version": _tf.__version__,
                  "model_config": _model_config(model)}
        self.driver.open(model, torch_optimizer, scaler=scaler, amp=amp_of(args),
                         base=Path(args.output_dir or ".") / "memtop", rank=rank,
                         world_size=world, max_steps=int(state.max_steps or 0), config=config,
                         broadcast=_broadcast if world > 1 else None)
        self._close_after_log = False
        if self._pre_hook is not None:  # a train() that raised never reached on_train_end
            self._pre_hook.remove()
        self._pre_hook = model.register_forward_pre_hook(self._on_forward_pre,
                                                         with_kwargs=True)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end_pending(args, control)
        self.driver.begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.driver.open_step:
            return
        if control.should_log:  # HF logs this step's loss right after: the row waits for it
            self._close_after_log = True
            return
        self._end(args, control)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
               **kwargs: Any) -> None:
        if self._close_after_log and self.driver.open_step:
            logs = logs or {}
            self._end(args, control, loss=logs.get("loss"), grad_norm=logs.get("grad_norm"))

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None,
                    **kwargs: Any) -> None:
        self._end_pending(args, control)
        self.driver.between(R.EVALUATE, {"metrics": numbers(metrics or {})})

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end_pending(args, control)
        path = Path(args.output_dir or ".") / f"checkpoint-{state.global_step}"
        self.driver.between(R.SAVE, {"path": str(path) if path.exists() else None})

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end_pending(args, control)
        if self._pre_hook is not None:
            self._pre_hook.remove()
            self._pre_hook = None
        self.driver.close()

    # inside ------------------------------------------------------------------------------------
    def _on_forward_pre(self, module: Any, args: Any, kwargs: Any) -> None:
        """A forward pass inside a step: its micro-batch counted (an evaluation's is not)."""
        if self.driver.open_step:
            self.driver.batch(kwargs if kwargs else args)

    def _end_pending(self, args: Any, control: Any) -> None:
        """A logging step whose log never came (a Trainer that does not log): its row now."""
        if self._close_after_log and self.driver.open_step:
            self._end(args, control)

    def _end(self, args: Any, control: Any, loss: Any = None, grad_norm: Any = None) -> None:
        self._close_after_log = False
        if self.driver.end(loss=loss, grad_norm=grad_norm):
            control.should_training_stop = True  # a viewer's x: HF's own end of training
            if str(getattr(args, "save_strategy", "no")).split(".")[-1].lower() != "no":
                control.should_save = True


def _model_config(model: Any) -> dict[str, Any] | None:
    config = getattr(model, "config", None)
    to_dict = getattr(config, "to_dict", None)
    if to_dict is None:
        return None
    try:
        return plain_values(to_dict())
    except Exception:
        return None


def _broadcast(value: str) -> str:
    """Rank 0's run folder to every rank (torch.distributed, set up by accelerate)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("several ranks but torch.distributed is not initialised")
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return str(box[0])
