"""Reading a step's scalars (loss, gradient norm, GradScaler scale) after the step, at one sync.

On CUDA each ``.item()`` waits for the device. A loop that logs the loss syncs once anyway; this
reads the gradient norm and the scale in the same transfer (``torch.stack(...).tolist()``), so
watching adds no sync of its own. On CPU there is nothing to wait for: each is read directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class StepValues:
    """What the loop handed over during one step (StepScope.set)."""

    loss: Any = None  # a tensor or a number
    grad_norm: Any = None
    output: torch.Tensor | None = None
    tokens: int | None = None
    samples: int | None = None


def _as_float(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return float(value.detach().reshape(-1)[0]) if value.numel() else None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def read_step_values(*values: Any) -> list[float | None]:
    """Each value (tensor, number or None) as a float; the CUDA tensors among them in one
    device-to-host transfer."""
    out: list[float | None] = [None] * len(values)
    on_device: dict[torch.device, list[int]] = {}
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor) and v.device.type != "cpu" and v.numel():
            on_device.setdefault(v.device, []).append(i)
        else:
            out[i] = _as_float(v)
    for idx in on_device.values():
        stacked = torch.stack([values[i].detach().reshape(-1)[0].float() for i in idx])
        for i, x in zip(idx, stacked.tolist(), strict=True):  # the one sync for this device
            out[i] = x
    return out
