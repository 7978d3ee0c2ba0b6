"""Memory counters, per device, read cheaply enough to sample every step.

CPU (Linux/glibc): the heap counters of glibc's ``mallinfo2()`` (every thread's arenas, byte-exact,
~1 µs) stand in for the allocator: ``allocated`` = bytes in use (uordblks + hblkhd), ``reserved`` =
bytes malloc holds from the OS (arena + hblkhd). Peak is the max of the sampled values, not a true
high-water mark. RSS comes from ``/proc/self/statm`` through a kept file descriptor.

CUDA: torch's caching-allocator counters (memory_allocated / memory_reserved /
max_memory_allocated),
which read host-side bookkeeping and add no device synchronisation.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass

import torch


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
            "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]


def _load_mallinfo2():
    path = ctypes.util.find_library("c")
    if path is None:
        return None
    try:
        fn = ctypes.CDLL(path).mallinfo2
    except (OSError, AttributeError):
        return None  # not glibc, or glibc older than 2.33
    fn.restype = _MallInfo2
    fn.argtypes = []
    return fn


_MALLINFO2 = _load_mallinfo2()


def heap_counters() -> tuple[int, int] | None:
    """(in_use_bytes, held_from_os_bytes) of the glibc heap, or None where mallinfo2 is missing."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return info.uordblks + info.hblkhd, info.arena + info.hblkhd


class RssReader:
    """Process RSS from /proc/self/statm, keeping the file open so a read is one pread."""

    def __init__(self) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        try:
            self._fd: int | None = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._fd = None

    def read(self) -> int | None:
        if self._fd is None:
            return None
        try:
            fields = os.pread(self._fd, 128, 0).split()
            return int(fields[1]) * self._page
        except (OSError, IndexError, ValueError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass(frozen=True)
class MemoryReading:
    allocated_bytes: int | None
    reserved_bytes: int | None
    peak_allocated_bytes: int | None
    host_rss_bytes: int | None


class MemoryProbe:
    """Reads allocated / reserved / peak for one device plus host RSS; never raises on a read."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.is_cuda = device.type == "cuda"
        self._rss = RssReader()
        self._cpu_peak: int | None = None

    @property
    def counter_source(self) -> str:
        """Where allocated/reserved come from, in words for the help screen and reports."""
        if self.is_cuda:
            return "torch.cuda caching allocator"
        return "glibc heap (mallinfo2)" if _MALLINFO2 is not None else "unavailable"

    def reset_peak(self) -> None:
        """Start the peak over (called after warmup so model set-up does not pollute it)."""
        if self.is_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            heap = heap_counters()
            self._cpu_peak = heap[0] if heap else None

    def observe_peak(self) -> None:
        """CPU only: fold one extra heap reading (~1 µs) into the sampled peak, mid-step."""
        if self.is_cuda:
            return  # the CUDA allocator keeps a true high-water mark itself
        heap = heap_counters()
        if heap is not None and (self._cpu_peak is None or heap[0] > self._cpu_peak):
            self._cpu_peak = heap[0]

    def read(self) -> MemoryReading:
        rss = self._rss.read()
        if self.is_cuda:
            try:
                return MemoryReading(
                    allocated_bytes=torch.cuda.memory_allocated(self.device),
                    reserved_bytes=torch.cuda.memory_reserved(self.device),
                    peak_allocated_bytes=torch.cuda.max_memory_allocated(self.device),
                    host_rss_bytes=rss,
                )
            except RuntimeError:
                return MemoryReading(None, None, None, rss)
        heap = heap_counters()
        if heap is None:
            return MemoryReading(None, None, None, rss)
        allocated, reserved = heap
        if self._cpu_peak is None or allocated > self._cpu_peak:
            self._cpu_peak = allocated
        return MemoryReading(allocated, reserved, self._cpu_peak, rss)

    def close(self) -> None:
        self._rss.close()
