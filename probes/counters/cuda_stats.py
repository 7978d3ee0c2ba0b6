"""The CUDA caching allocator's figures as plain data: the stats dict read into memtop's fields,
and what reserved − allocated and the allocator's trouble counters mean. No torch here, so the
report reads a CUDA run's figures on any machine (probes/counters/cudamem.py reads the device).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

# the cache counts as large against allocated above this ratio and this many bytes
CACHE_RATIO_HINT = 0.5
CACHE_BYTES_HINT = 256 * 1024 * 1024
EXPANDABLE_HINT = (
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets a segment grow in place instead of "
    "caching many fixed-size ones, so varying sizes (shapes that change from step to step) "
    "leave fewer unusable gaps; set it before the first CUDA allocation")


class CudaStats(NamedTuple):
    """The figures memtop takes from one ``memory_stats_as_nested_dict()`` call (a NamedTuple:
    made every step on CUDA, ~0.4 µs against a frozen dataclass's ~3 µs)."""

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
    initialised) reads as None. The step path's read: a dict as torch's caching allocator
    gives it is read with seven lookups; anything else takes the careful walk."""
    try:
        alloc, resv = stats["allocated_bytes"]["all"], stats["reserved_bytes"]["all"]
        out = CudaStats(alloc["current"], resv["current"], alloc["peak"], resv["peak"],
                        stats["inactive_split_bytes"]["all"]["current"],
                        stats["num_alloc_retries"], stats["num_ooms"])
    except (KeyError, TypeError, IndexError):
        out = None
    if out is not None and all(type(v) is int for v in out):
        return out
    return CudaStats(
        allocated_bytes=_get(stats, "allocated_bytes", "all", "current"),
        reserved_bytes=_get(stats, "reserved_bytes", "all", "current"),
        peak_allocated_bytes=_get(stats, "allocated_bytes", "all", "peak"),
        peak_reserved_bytes=_get(stats, "reserved_bytes", "all", "peak"),
        inactive_split_bytes=_get(stats, "inactive_split_bytes", "all", "current"),
        alloc_retries=_get(stats, "num_alloc_retries"),
        ooms=_get(stats, "num_ooms"))


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
