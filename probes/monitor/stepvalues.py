"""Reading a step's scalars (loss, gradient norm, GradScaler scale) after the step, at one sync.

On CUDA each ``.item()`` waits for the device. A loop that logs the loss syncs once anyway; this
reads the gradient norm and the scale in the same transfer (``torch.stack(...).tolist()``), so
watching adds no sync of its own. On CPU there is nothing to wait for: each is read directly.
``ScalerWatch`` hands over the GradScaler's scale as a tensor (no sync) and counts the steps it
skipped from the values read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from probes.records.errors import NonFiniteError


@dataclass
class StepValues:
    """What the loop handed over during one step (StepScope.set)."""

    loss: Any = None  # a tensor or a number
    grad_norm: Any = None
    output: torch.Tensor | None = None
    tokens: int | None = None
    samples: int | None = None
    micro_batches: int | None = None  # told by a loop whose model's forward is not one per batch


def _as_float(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        n = value.numel()
        if n == 1:
            return float(value.item())  # one dispatch (not detach, reshape, index: ~5 µs)
        return float(value.detach().reshape(-1)[0]) if n else None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def read_step_values(*values: Any) -> tuple[list[float | None], bool]:
    """Each value (tensor, number or None) as a float, the CUDA tensors among them in one
    device-to-host transfer; and whether there was one (the step then synced its device)."""
    out: list[float | None] = [None] * len(values)
    on_device: dict[torch.device, list[int]] = {}
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor) and v.device.type != "cpu":
            if v.numel():
                on_device.setdefault(v.device, []).append(i)
        else:
            out[i] = _as_float(v)
    for idx in on_device.values():
        stacked = torch.stack([values[i].detach().reshape(-1)[0].float() for i in idx])
        for i, x in zip(idx, stacked.tolist(), strict=True):  # the one sync for this device
            out[i] = x
    return out, bool(on_device)


class ScalerWatch:
    """A GradScaler's scale, read with the step's other values, and the optimizer steps it
    skipped: the scaler backs off (lowers its scale) exactly when it skipped a step."""

    def __init__(self, scaler: torch.amp.GradScaler | None) -> None:
        self.enabled = scaler is not None and scaler.is_enabled()
        self._scaler = scaler
        self.skipped = 0
        # the init scale until the first step: no sync
        self.scale = float(scaler.get_scale()) if self.enabled and scaler is not None else None

    def scale_tensor(self) -> Any:
        """The scale as it stands, without a sync (read_step_values reads it with the loss)."""
        scaler = self._scaler
        if scaler is None or not self.enabled:
            return None
        getter = getattr(scaler, "_get_scale_async", None)
        tensor = getter() if getter is not None else None
        return tensor if tensor is not None else scaler.get_scale()

    def update(self, scale: float | None) -> None:
        """The scale read after a step: a lower one than before means the step was skipped."""
        if scale is None:
            return
        if self.scale is not None and scale < self.scale:
            self.skipped += 1
        self.scale = scale


def non_finite_error(step: int, amp: str, loss: float | None, grad_norm: float | None) \
        -> NonFiniteError | None:
    """The error for a step whose loss or gradient norm is inf/nan (Monitor's
    ``non_finite="fail"`` without a GradScaler to skip such a step); None when both are finite."""
    for what, value in (("loss", loss), ("gradient norm", grad_norm)):
        if value is not None and not math.isfinite(value):
            return NonFiniteError(f"{what} became {value} at step {step} with amp={amp} and no "
                                  "GradScaler to skip it; the weights are no longer valid")
    return None
