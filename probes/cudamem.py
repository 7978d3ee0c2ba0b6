"""The CUDA caching allocator, read for memtop: one stats dict per step, fragmentation figures,
the opt-in allocation history, and what an OOM leaves behind.

Read against torch 2.13's torch/cuda/memory.py, never run on a GPU in this project (README, CUDA):
``memory_allocated``, ``memory_reserved`` and ``max_memory_allocated`` each rebuild *and flatten*
the whole stats dict (~120 keys); ``memory_stats_as_nested_dict`` is the one C++ call under all
of them, so a step reads it once and takes every figure from that dict (``stats_from_nested``).

Allocation history (``_record_memory_history``) is off unless asked for: with torch's defaults
(context="all", stacks="all") every allocation costs ~2 µs Python + ~2 µs C++ and several KB of
host memory, and dumping a snapshot took torchtitan 461 s with stacks="all" against 4 s with
"python". memtop records Python stacks only, a bounded number of entries, and stops at run end.
Without it an OOM still leaves ``memory_summary`` text and a state-only snapshot (the segments
and blocks alive at that moment, with no stacks).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HISTORY_MAX_ENTRIES = 100_000  # ring buffer of alloc/free events (~1,100 per default step)
HISTORY_STACKS = "python"  # "all" adds C++ frames: minutes to dump (see the module docstring)
SUMMARY_FILE = "cuda_memory_summary.txt"
SNAPSHOT_FILE = "cuda_memory_snapshot.pickle"
# the cache counts as large against allocated above this ratio and this many bytes
CACHE_RATIO_HINT = 0.5
CACHE_BYTES_HINT = 256 * 1024 * 1024
EXPANDABLE_HINT = (
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets a segment grow in place instead of "
    "caching many fixed-size ones, so varying sizes (shapes that change from step to step) "
    "leave fewer unusable gaps; set it before the first CUDA allocation")


@dataclass(frozen=True)
class CudaStats:
    """The figures memtop takes from one ``memory_stats_as_nested_dict()`` call."""

    allocated_bytes: int | None
    reserved_bytes: int | None
    peak_allocated_bytes: int | None  # since the last reset_peak_memory_stats
    peak_reserved_bytes: int | None
    inactive_split_bytes: int | None  # cached, free, but inside a split block: fragmentation
    alloc_retries: int | None  # cudaMalloc failed, the cache was flushed and the call retried
    ooms: int | None  # out-of-memory errors the allocator raised


def _get(stats: Mapping[str, Any], *path: str) -> int | None:
    node: Any = stats
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return int(node) if isinstance(node, int) and not isinstance(node, bool) else None


def stats_from_nested(stats: Mapping[str, Any]) -> CudaStats:
    """The nested dict of ``torch.cuda.memory_stats_as_nested_dict`` as memtop's figures; a key
    the allocator does not report (cudaMallocAsync reports zeros, an empty dict before CUDA is
    initialised) reads as None."""
    return CudaStats(
        allocated_bytes=_get(stats, "allocated_bytes", "all", "current"),
        reserved_bytes=_get(stats, "reserved_bytes", "all", "current"),
        peak_allocated_bytes=_get(stats, "allocated_bytes", "all", "peak"),
        peak_reserved_bytes=_get(stats, "reserved_bytes", "all", "peak"),
        inactive_split_bytes=_get(stats, "inactive_split_bytes", "all", "current"),
        alloc_retries=_get(stats, "num_alloc_retries"),
        ooms=_get(stats, "num_ooms"))


def read_stats(device: Any) -> CudaStats | None:
    """One allocator read for ``device``; None when CUDA cannot answer."""
    import torch

    try:
        return stats_from_nested(torch.cuda.memory_stats_as_nested_dict(device))
    except (RuntimeError, AssertionError):
        return None


@dataclass(frozen=True)
class Fragmentation:
    """How much the caching allocator holds beyond live tensors, and what that suggests."""

    cached_free_bytes: int  # reserved - allocated: cached for reuse, not returned to the driver
    cached_ratio: float  # cached_free / allocated (0 when nothing is allocated)
    inactive_split_bytes: int | None  # the part of the cache inside split blocks
    alloc_retries: int | None
    ooms: int | None
    hint: str | None  # a sentence when the figures call for one


def fragmentation(allocated: int | None, reserved: int | None,
                  inactive_split: int | None = None, alloc_retries: int | None = None,
                  ooms: int | None = None) -> Fragmentation | None:
    """reserved - allocated and the allocator's trouble counters, with a hint when the cache is
    large against what is allocated or cudaMalloc had to be retried. None without both counters.
    """
    if allocated is None or reserved is None:
        return None
    cached = max(0, reserved - allocated)
    ratio = cached / allocated if allocated > 0 else 0.0
    hint = None
    if alloc_retries:
        hint = (f"cudaMalloc failed and was retried after flushing the cache {alloc_retries} "
                "time(s): the allocator is at the edge of device memory, and each retry "
                "synchronises and costs milliseconds. " + EXPANDABLE_HINT)
    elif cached >= CACHE_BYTES_HINT and ratio >= CACHE_RATIO_HINT:
        hint = (f"the cache holds {ratio:.0%} of allocated on top of it (reserved ≫ allocated); "
                "empty_cache() only hands it back until the next step needs it again. "
                + EXPANDABLE_HINT)
    return Fragmentation(cached, ratio, inactive_split, alloc_retries, ooms, hint)


def driver_overhead_bytes(nvml_used: int | None, reserved: int | None) -> int | None:
    """NVML's memory for this process minus what the caching allocator reserved: the CUDA
    context (a few hundred MiB), cuBLAS/cuDNN workspaces, NCCL buffers and any memory allocated
    outside PyTorch. None when either is unknown; negative values (NVML read before the cache
    grew) are kept, they say the two reads were not taken at the same moment."""
    if nvml_used is None or reserved is None:
        return None
    return nvml_used - reserved


# ---- allocation history --------------------------------------------------------------------
def history_kwargs(max_entries: int = HISTORY_MAX_ENTRIES) -> dict[str, Any]:
    """The arguments memtop passes to ``torch.cuda.memory._record_memory_history``."""
    return {"enabled": "all", "context": "all", "stacks": HISTORY_STACKS,
            "max_entries": max_entries}


def start_history(device: Any, wanted: bool) -> str:
    """Turn allocation history on when wanted and the device is CUDA; returns what run_started
    records ("off", "python stacks, N entries", or why it could not start)."""
    if not wanted:
        return "off"
    if getattr(device, "type", None) != "cuda":
        return "off (allocation history exists only for CUDA devices)"
    import torch

    try:
        torch.cuda.memory._record_memory_history(**history_kwargs())
    except Exception as exc:  # an allocator backend without history (cudaMallocAsync)
        return f"off (could not start: {type(exc).__name__}: {exc})"
    return f"{HISTORY_STACKS} stacks, {HISTORY_MAX_ENTRIES} entries"


def stop_history(state: str) -> None:
    """Turn history off again when ``start_history`` turned it on (its label says so)."""
    if state.startswith("off"):
        return
    import torch

    try:
        torch.cuda.memory._record_memory_history(enabled=None)
    except Exception:
        pass


def dump_snapshot(run_dir: Path, device: Any, step: int, history: str = "off") -> dict[str, Any]:
    """A snapshot for pytorch.org/memory_viz into the run folder, asked for at a step boundary
    (the `m` key): written to a temporary name and renamed, so a reader never sees half a file.
    Runs on the training thread; state only (fast) unless allocation history is on."""
    if getattr(device, "type", None) != "cuda":
        return {"error": "memory snapshots exist only for CUDA devices"}
    import torch

    path = Path(run_dir) / f"cuda_memory_snapshot-step{step:06d}.pickle"
    tmp = path.with_name(path.name + ".tmp")
    t0 = time.perf_counter()
    try:
        torch.cuda.memory._dump_snapshot(str(tmp))
        tmp.replace(path)
    except Exception as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"path": path.name, "dump_s": round(time.perf_counter() - t0, 3),
            "bytes": path.stat().st_size,
            "kind": "state only" if history.startswith("off") else f"with history ({history})"}


def failure_artifacts(run_dir: Path, device: Any, history: str = "off") -> dict[str, Any]:
    """On CUDA, keep what explains a failure: memory_summary text and an allocator snapshot
    (state only, without stacks, unless history is on); the dump time is recorded."""
    out: dict[str, Any] = {}
    if getattr(device, "type", None) != "cuda":
        return out
    import torch

    if not torch.cuda.is_available():
        return out
    try:
        summary = Path(run_dir) / SUMMARY_FILE
        summary.write_text(torch.cuda.memory_summary(device), encoding="utf-8")
        out["memory_summary"] = summary.name
    except Exception as err:  # keep going: the error row matters more
        out["memory_summary_error"] = str(err)
    try:
        snapshot = Path(run_dir) / SNAPSHOT_FILE
        t0 = time.perf_counter()
        torch.cuda.memory._dump_snapshot(str(snapshot))
        out["memory_snapshot"] = snapshot.name
        out["memory_snapshot_s"] = round(time.perf_counter() - t0, 3)
        out["memory_snapshot_kind"] = ("state only (no --memory-history)"
                                       if history.startswith("off")
                                       else f"with allocation history ({history})")
    except Exception as err:
        out["memory_snapshot_error"] = str(err)
    return out
