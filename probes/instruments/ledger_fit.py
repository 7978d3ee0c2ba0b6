"""What the live "fits B ≤ …, T ≤ …" line needs from a ledger measurement, read on the
training thread at the measured step only (never on the step path): the run's level between
steps (read at the measured step's start) and the budget the line is against. The line itself
is computed where the ledger event is read (probes/analysis/fit_live.py), off the training
thread.

The budget: the run's --max-memory (per rank, as its guard's limit) when set; else on CUDA the
device's free memory plus what this process's allocator holds, on CPU the RAM still available
plus this process's RSS (as `memtop fit`, trainer/fitmeter.py default_budget).
"""

from __future__ import annotations

from typing import Any

import torch

from probes.counters.host import RssReader, host_available_bytes
from probes.counters.memory import heap_counters

_RSS = RssReader()


def rest_level(device: torch.device) -> dict[str, int | None]:
    """The run's level between steps: the counters at a step's start (the previous step's
    gradients freed), and on CPU the RSS beside them."""
    if device.type == "cuda":
        return {"allocated": torch.cuda.memory_allocated(device),
                "reserved": torch.cuda.memory_reserved(device), "rss": None}
    heap = heap_counters()
    used, held = heap if heap is not None else (None, None)
    return {"allocated": used, "reserved": held, "rss": _RSS.read()}


def budget(device: torch.device, max_memory_bytes: int | None) -> tuple[int | None, str]:
    """(bytes, where they come from) of the memory this process may grow to."""
    if max_memory_bytes is not None:
        return max_memory_bytes, "--max-memory"
    if device.type == "cuda":
        try:
            free, _ = torch.cuda.mem_get_info(device)
        except RuntimeError:
            return None, "n/a"
        return free + torch.cuda.memory_reserved(device), "device free + this process's reserved"
    available, rss = host_available_bytes(), _RSS.read()
    if available is None or rss is None:
        return None, "n/a"
    return available + rss, "RAM available + this process's RSS"


def facts(ctx: Any, rest: dict[str, int | None]) -> dict[str, Any]:
    """The ledger event's fields for the live line."""
    limit, source = budget(ctx.device, ctx.max_memory_bytes)
    shape = ctx.model_shape
    return {"rest": rest, "budget_bytes": limit, "budget_source": source,
            "max_seq_len": shape.block_size if shape is not None else None,
            "world_size": _world()}


def _world() -> int:
    import os

    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1
