"""What GPU claims and the runner share about the device: freeing what a run left, the bytes
allocated and the tensors Python still reaches (the runner's leftover check), and whether the
allocator records its history now (a probe the history claims first show to work)."""

from __future__ import annotations

import gc
import itertools
from typing import Any

_HISTORY_PROBES = itertools.count()  # each history probe allocates a size never used before


def history_recording(device: Any) -> bool:
    """Whether the allocator records history now: allocate a size no earlier probe used and
    look for that allocation (its address, its requested or rounded size) among the newest
    trace entries. History records the requested size; a fresh size each time means an old
    entry of a reused block can never match."""
    import torch

    size = 1_234_567 + 8192 * next(_HISTORY_PROBES)
    probe = torch.empty(size, dtype=torch.uint8, device=device)
    ptr = probe.untyped_storage().data_ptr()
    traces = torch.cuda.memory._snapshot()["device_traces"]
    del probe
    sizes = {size, -(-size // 512) * 512}
    return any(e.get("action") == "alloc" and e.get("addr") == ptr and e.get("size") in sizes
               for t in traces for e in t[-256:])


def sees_history_when_on(device: Any) -> bool:
    """The history probe, shown to work: allocation history on, probed, off again."""
    import torch

    torch.cuda.memory._record_memory_history(enabled="all", max_entries=4096)
    try:
        return history_recording(device)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def free_device() -> None:
    """Collect what the last run left in cycles and hand the allocator's cache back."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    except Exception:
        pass


def allocated_bytes(device: str) -> int | None:
    """Live tensor bytes on the device now (None off CUDA)."""
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    from probes.counters.device_index import indexed_device

    return int(torch.cuda.memory_allocated(indexed_device(device)))


def live_tensor_bytes(device: str) -> int | None:
    """Bytes of the device tensors Python still reaches (each storage once): what a model, its
    gradients or its optimizer state left alive would show. Allocated memory alone would also
    count what torch keeps on purpose (a cuBLAS workspace per thread and stream)."""
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    gc.collect()
    storages: dict[int, int] = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.is_cuda:
                storage = obj.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        except Exception:  # a tensor subclass or a meta tensor without storage
            continue
    return sum(storages.values())
