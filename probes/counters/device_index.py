"""One CUDA device, always with its index: what torch's per-device calls need.

torch.cuda's functions take a device in one of two ways (torch/cuda/_utils.py,
``_get_device_index``): most accept ``torch.device("cuda")`` and read it as the current device
(``memory_stats``, ``reset_peak_memory_stats``, ``memory_summary``, ``get_device_properties``),
but some refuse it with "Expected a torch.device with a specified index or an integer"
(``set_per_process_memory_fraction``, ``get_per_process_memory_fraction``, ``set_device``,
``caching_allocator_alloc``, ``use_mem_pool``); the raw C calls memtop makes on the step path
(probes/counters/memory.py, probes/instruments/phases.py) take the index itself. So a device is
normalised once, where memtop or a GPU claim first holds it, and every later call gets an index.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def indexed_device(device: Any, current: Callable[[], int] | None = None) -> torch.device:
    """``device`` ("cuda", "cuda:1", 0, ``torch.device("cuda")`` ...) as a torch.device; a CUDA
    device without an index gets the current one (``current()``, torch.cuda.current_device by
    default: what torch itself would use for it). Other devices come back as they are; an int
    is a CUDA index, as in torch.cuda's own calls."""
    if isinstance(device, bool):
        raise TypeError(f"not a device: {device!r}")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"a CUDA device index is zero or more, got {device}")
        return torch.device("cuda", device)
    dev = device if isinstance(device, torch.device) else torch.device(device)
    if dev.type != "cuda" or dev.index is not None:
        return dev
    index = (current or torch.cuda.current_device)()
    return torch.device("cuda", int(index))


def device_index(device: Any, current: Callable[[], int] | None = None) -> int:
    """The CUDA index of ``device`` (see ``indexed_device``); ValueError for another kind."""
    dev = indexed_device(device, current)
    if dev.type != "cuda" or dev.index is None:
        raise ValueError(f"not a CUDA device: {device!r}")
    return dev.index
