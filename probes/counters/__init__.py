"""Counters, one interface per device kind: the host heap and RSS (glibc mallinfo2,
/proc/self/statm), the CUDA caching allocator, NVML's driver-level view (polled on its own
thread), the training process's children (DataLoader workers: RSS, PSS and USS from /proc,
read on their own thread), and the machine's facts for reports. A counter that cannot read
returns None (shown "n/a"); nothing here raises on a missing device or driver.

    from probes.counters import MemoryProbe, NvmlPoller, system_info

    probe = MemoryProbe(torch.device("cpu"))
    probe.begin_step(); ...; reading = probe.read()   # MemoryReading: bytes, units in names
    nvml = NvmlPoller.for_cuda_device(device); nvml.start(); nvml.latest  # never blocks a step
    workers = ProcessTreeSampler(interval_s=1.0); workers.start(); workers.latest  # the same

Names load lazily (probes/tools/lazy.py): memory.py imports torch, so ``from probes.counters
import memtop_version`` must not pay for it.
"""

from __future__ import annotations

from probes.tools.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("MemoryProbe", "MemoryReading", "guard_trip",
                     "heap_counters"), ".memory"),
    **dict.fromkeys(("CudaStats", "Fragmentation", "driver_overhead_bytes", "fragmentation",
                     "stats_from_nested"), ".cuda_stats"),
    **dict.fromkeys(("dump_snapshot", "failure_artifacts", "history_kwargs", "read_stats",
                     "start_history", "stop_history", "SNAPSHOT_FILE", "SUMMARY_FILE"),
                    ".cudamem"),
    **dict.fromkeys(("NvmlPoller", "NvmlReading", "candidate_uuids", "index_fallback"),
                    ".nvml"),
    **dict.fromkeys(("RssReader", "host_available_bytes", "host_info", "host_ram_bytes",
                     "memtop_version", "peak_rss_bytes", "reset_peak_rss"), ".host"),
    "system_info": ".sysinfo",
    **dict.fromkeys(("ChildChange", "ChildMemory", "ProcessTreeSampler", "WorkersReading"),
                    ".workers"),
    **dict.fromkeys(("ChildLister", "parse_rollup", "parse_stat", "read_memory"),
                    ".proctree"),
    **dict.fromkeys(("FillForecast", "FillTracker", "fill_forecast", "filling_counter"),
                    ".fill"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
