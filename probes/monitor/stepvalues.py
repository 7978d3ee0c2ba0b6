"""Reading a step's scalars (loss, gradient norm, GradScaler scale) after the step, at one sync.

On CUDA each ``.item()`` waits for the device. A loop that logs the loss syncs once anyway; this
reads the gradient norm and the scale with it, at that one sync: each device value is copied
(``non_blocking``) into its slot of a pinned host buffer made once per device, then the
device's stream is synchronised once and the buffer read on the host (issue 45: no per-step
``torch.stack`` kernel, no new tensor, one wait). The values read are the step's own: the
copies are queued after the step's work on the same stream, so the loss, gradient norm and
scale a row shows are those of the step it is the row of. On CPU there is nothing to wait
for: each is read directly. ``ScalerWatch`` hands over the GradScaler's scale as a tensor (no
sync) and counts the steps it skipped from the values read.
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


# what StepValueReader.queue hands to wait: the values read so far, and per device its host
# buffer, its wait and which values its slots hold (None: no device value)
Queued = tuple[list[float | None], list[tuple[torch.Tensor, Any, list[int]]] | None]


class StepValueReader:
    """Reads a step's scalars, the device tensors among them at one sync per device (see the
    module docstring). ``slot_devices``: the device kinds read through host slots (CUDA; a
    test passes "cpu" too, to run the same bookkeeping on CPU tensors)."""

    def __init__(self, slot_devices: tuple[str, ...] = ("cuda",)) -> None:
        self.slot_devices = slot_devices
        self._slots: dict[torch.device, tuple[torch.Tensor, list[torch.Tensor], Any]] = {}
        copy = getattr(torch, "_foreach_copy_", None)
        self._copy = copy  # one dispatch for every slot (torch >= 2.1), else copy_ each

    def _device_slots(self, device: torch.device, n: int) \
            -> tuple[torch.Tensor, list[torch.Tensor], Any]:
        held = self._slots.get(device)
        if held is None or len(held[1]) < n:
            cuda = device.type == "cuda"
            host = torch.empty(max(n, 4), dtype=torch.float32, pin_memory=cuda)
            sync = torch.cuda.current_stream(device).synchronize if cuda else None
            held = (host, [host[i] for i in range(host.numel())], sync)
            self._slots[device] = held
        return held

    def queue(self, *values: Any) -> Queued:
        """Start reading ``values``: the numbers and host tensors are read now, each device
        value's copy into its slot is queued (no wait). ``wait`` finishes; between the two the
        caller may do host work while the device runs (the Monitor reads the allocator)."""
        out: list[float | None] = [None] * len(values)
        on_device: dict[torch.device, list[int]] | None = None
        slot_devices = self.slot_devices
        for i, v in enumerate(values):
            if isinstance(v, torch.Tensor) and v.device.type in slot_devices:
                if v.numel():
                    if on_device is None:
                        on_device = {}
                    on_device.setdefault(v.device, []).append(i)
            else:
                out[i] = _as_float(v)
        if on_device is None:
            return out, None
        pending = []
        for device, idx in on_device.items():
            host, views, sync = self._device_slots(device, len(idx))
            srcs = [_scalar_view(values[i]) for i in idx]
            dsts = views[:len(idx)]
            if self._copy is not None:
                self._copy(dsts, srcs, non_blocking=True)
            else:
                for dst, src in zip(dsts, srcs, strict=True):
                    dst.copy_(src, non_blocking=True)
            pending.append((host, sync, idx))
        return out, pending

    @staticmethod
    def wait(queued: Queued) -> tuple[list[float | None], bool]:
        """The values ``queue`` started, after one wait per device (the step's work and the
        copies); and whether a device was waited for (the step then synced its device)."""
        out, pending = queued
        if pending is None:
            return out, False
        for host, sync, idx in pending:
            if sync is not None:
                sync()  # the one wait for this device
            got = host.tolist()  # a host tensor: no device involved
            for k, i in enumerate(idx):
                out[i] = got[k]
        return out, True

    def read(self, *values: Any) -> tuple[list[float | None], bool]:
        """Each value (tensor, number or None) as a float; and whether a device was waited
        for (``queue`` then ``wait``)."""
        return self.wait(self.queue(*values))


def _scalar_view(value: torch.Tensor) -> torch.Tensor:
    """A value's first element as a 0-dim view (no copy): what a slot is copied from."""
    if value.dim() == 0:
        return value.detach()
    return value.detach().reshape(-1)[0]


def read_step_values(*values: Any) -> tuple[list[float | None], bool]:
    """Each value (tensor, number or None) as a float, the CUDA tensors among them at one sync
    per device; and whether there was one. A Monitor keeps one ``StepValueReader`` (its host
    slots made once); this makes a reader for one call."""
    return StepValueReader().read(*values)


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
