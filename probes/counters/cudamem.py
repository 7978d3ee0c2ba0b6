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
from pathlib import Path
from typing import Any

from probes.counters.cuda_stats import CudaStats, stats_from_nested

HISTORY_MAX_ENTRIES = 100_000  # ring buffer of alloc/free events (~1,100 per default step)
HISTORY_STACKS = "python"  # "all" adds C++ frames: minutes to dump (see the module docstring)
SUMMARY_FILE = "cuda_memory_summary.txt"
SNAPSHOT_FILE = "cuda_memory_snapshot.pickle"


def read_stats(device: Any) -> CudaStats | None:
    """One allocator read for ``device`` through torch's public call; None when CUDA cannot
    answer. The step path uses ``StatsReader`` (the same dict, one C call)."""
    import torch

    try:
        return stats_from_nested(torch.cuda.memory_stats_as_nested_dict(device))
    except Exception:  # no CUDA in this torch, a device that is gone: n/a, never a raise
        return None


class StatsReader:
    """One CUDA device's allocator counters on the step path: ``torch._C._cuda_memoryStats``
    with the device's index, resolved once (probes/counters/device_index.py). It is the call
    under ``memory_stats_as_nested_dict``, whose Python wrapper adds a device-index lookup per
    call (~6 µs on an H200: ../shared/gpu-artifacts/h200-first-run/host-call-floor.txt, 14.5 µs
    the raw call against 83 µs for ``memory_stats``); ``reset_peak`` is
    ``_cuda_resetPeakMemoryStats`` the same way. Where torch lacks either C call, or it
    refuses (CUDA not initialised yet), the public function answers."""

    def __init__(self, device: Any) -> None:
        import torch

        from probes.counters.device_index import indexed_device

        self.device = indexed_device(device)
        self.index = self.device.index
        self._raw_stats = getattr(torch._C, "_cuda_memoryStats", None)
        self._raw_reset = getattr(torch._C, "_cuda_resetPeakMemoryStats", None)

    def read(self) -> CudaStats | None:
        raw = self._raw_stats
        if raw is not None:
            try:
                return stats_from_nested(raw(self.index))
            except Exception:  # not initialised yet, or a backend without stats
                pass
        return read_stats(self.device)

    def reset_peak(self) -> None:
        """Start the allocator's high-water mark over (host bookkeeping, no sync)."""
        raw = self._raw_reset
        if raw is not None:
            try:
                raw(self.index)
                return
            except Exception:
                pass
        import torch

        try:
            torch.cuda.reset_peak_memory_stats(self.device)
        except Exception:  # no CUDA in this torch, or not initialised: nothing to reset
            pass


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
