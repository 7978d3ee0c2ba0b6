"""Memory counters, per device, read cheaply enough to sample every step.

CPU (Linux/glibc): the heap counters of glibc's ``mallinfo2()`` (every thread's arenas, byte-exact,
~1 µs) stand in for the allocator: ``allocated`` = bytes in use (uordblks + hblkhd), ``reserved`` =
bytes malloc holds from the OS (arena + hblkhd). Peak is the max of the sampled values, not a true
high-water mark. RSS comes from ``/proc/self/statm`` through a kept file descriptor.

CUDA: torch's caching-allocator counters, from one raw stats call per step (the C call under
``memory_stats_as_nested_dict()``, with the device's index resolved once: probes/counters/cudamem.py
``StatsReader``), which reads host-side bookkeeping and adds no device synchronisation. The
allocator's peak is reset at the start of every step, so it is *this step's* high-water mark
(what an OOM runs into); the run's peak is the max of the step peaks, kept here. The host heap is
read too, at a budgeted rate, for the leak watch (``host_heap_bytes``: a leak of host objects).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import time
from collections import deque
from typing import NamedTuple

import torch

from probes.counters.cudamem import StatsReader
from probes.counters.host import RssReader


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


def _load_malloc_trim():
    path = ctypes.util.find_library("c")
    if path is None:
        return None
    try:
        fn = ctypes.CDLL(path).malloc_trim  # a CDLL call releases the GIL while it runs
    except (OSError, AttributeError):
        return None  # not glibc
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_size_t]
    return fn


_MALLOC_TRIM = _load_malloc_trim()


def trim_heap() -> bool | None:
    """Give glibc's free heap pages back to the OS (``malloc_trim(0)``: every arena's free
    pages, not only the top). After a profiler window the profiler's freed event buffers and
    export strings stay in glibc's arenas as RSS otherwise (issue 28). True when memory was
    released, False when none could be, None where glibc is missing. The GIL is released
    meanwhile: a UI thread does not wait for it."""
    if _MALLOC_TRIM is None:
        return None
    return bool(_MALLOC_TRIM(0))


def heap_counters() -> tuple[int, int] | None:
    """(in_use_bytes, held_from_os_bytes) of the glibc heap, or None where mallinfo2 is missing."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return info.uordblks + info.hblkhd, info.arena + info.hblkhd


class MemoryReading(NamedTuple):
    """One read of the counters (a NamedTuple: made every step, ~0.4 µs against a frozen
    dataclass's ~3 µs; issue 28)."""

    allocated_bytes: int | None
    reserved_bytes: int | None
    peak_allocated_bytes: int | None  # the run's peak since reset_peak()
    host_rss_bytes: int | None
    step_peak_allocated_bytes: int | None = None  # this step's high-water mark (CPU: sampled)
    inactive_split_bytes: int | None = None  # CUDA: cached free memory inside split blocks
    alloc_retries: int | None = None  # CUDA: cudaMalloc retries after a cache flush
    ooms: int | None = None  # CUDA: out-of-memory errors raised
    heap_fresh: bool = True  # CPU: False when allocated/reserved repeat an earlier heap read
    # CUDA: the host heap in use (mallinfo2), read at the step's end at its budgeted rate
    # (CUDA_HEAP_READ_BUDGET) for the leak watch; None on the steps between (and on CPU, where
    # allocated_bytes is the heap)
    host_heap_bytes: int | None = None


# CPU: the mid-step heap read (end of forward: the activations' peak) is taken while one heap
# read costs at most this share of the previous step, and whatever it costs on the first
# MID_STEP_FIRST steps after each peak reset (so a run's peak has its forward peak from its
# first measured steps on) and on every MID_STEP_EVERY-th step. mallinfo2 walks glibc's free
# lists: ~1 µs on a small heap, ~55-100 µs on a training process's (benchmarks/RESULTS.md, issue
# 28), which on a fast step is its own overhead; a step without it has the end-of-step reading
# as its sampled step peak.
MID_STEP_BUDGET = 0.002
MID_STEP_FIRST = 3
MID_STEP_EVERY = 16
# CPU: the end-of-step heap read itself, when one costs more than HEAP_READ_BUDGET of the step
# and more than HEAP_READ_FLOOR_S (a healthy heap's read, 1-100 µs, is always taken), is taken
# every k-th step, k the fewest that keeps it within the budget, at most HEAP_READ_MAX_EVERY;
# the steps between repeat the last reading (``heap_fresh`` False: the leak watch takes them as
# no point, not as a gap) and take no mid-step read. A heap that a leak fragments makes
# mallinfo2 slow: ~30 ms a read on memtop's graph demo after 3,000 steps of a 5 ms step, which
# slowed that run ~8x (benchmarks/RESULTS.md, issue 28).
HEAP_READ_BUDGET = 0.01
HEAP_READ_FLOOR_S = 0.002
HEAP_READ_MAX_EVERY = 16
# CUDA: the host heap is not the allocated counter, but a leak of host objects (the autograd
# graph a kept loss holds: ~150 KiB/step of heap, a few hundred bytes of device memory) shows
# only there, so the leak watch needs it too (issue 45). Its read (a mallinfo2 walk, 5-100 µs
# in a training process) is taken at the step's end every k-th step, k the fewest that keeps it
# within CUDA_HEAP_READ_BUDGET of the step (the whole of memtop's share of a GPU step is ~1%),
# at most CUDA_HEAP_READ_MAX_EVERY; a read under CUDA_HEAP_READ_FLOOR_S is taken every step.
CUDA_HEAP_READ_BUDGET = 0.002
CUDA_HEAP_READ_FLOOR_S = 0.000_005
CUDA_HEAP_READ_MAX_EVERY = 8


def heap_read_every(read_s: float, step_s: float, floor_s: float = HEAP_READ_FLOOR_S,
                    budget: float = HEAP_READ_BUDGET, max_every: int = HEAP_READ_MAX_EVERY) -> int:
    """Every how many steps the end-of-step heap read is taken: 1 while one read costs at most
    ``floor_s`` or ``budget`` of the step, else the fewest steps that bring it within that
    budget (at most ``max_every``)."""
    budget_s = max(floor_s, budget * step_s)
    if read_s <= budget_s:
        return 1
    return min(max_every, math.ceil(read_s / budget_s))


class MemoryProbe:
    """Reads allocated / reserved / peak for one device plus host RSS; never raises on a read.

    ``begin_step()`` starts a step's peak; ``read()`` at the step's end gives that step's peak
    and folds it into the run's peak (from ``reset_peak()`` on).
    """

    def __init__(self, device: torch.device, host_heap: bool = False) -> None:
        """``host_heap``: on CUDA also read the host heap at the step's end, at its budgeted
        rate (``MemoryReading.host_heap_bytes``): set by the Monitor when an instrument wants
        it (the leak watch), off otherwise (CPU reads the heap as its allocated counter)."""
        self.host_heap = host_heap
        self.is_cuda = device.type == "cuda"
        # CUDA: the device with its index, the raw allocator calls bound once (cudamem.py)
        self._cuda = StatsReader(device) if self.is_cuda else None
        self.device = self._cuda.device if self._cuda is not None else device
        self._rss = RssReader()
        self._run_peak: int | None = None
        self._step_peak: int | None = None  # CPU: max of the heap readings in this step
        self._steps = 0  # steps begun (CPU: which take the mid-step read whatever it costs)
        self._since_reset = 0  # steps begun since the last reset_peak()
        self._began_s = 0.0  # CPU: perf_counter at the step's start
        self._step_s = 0.0  # CPU: the last step's span, begin_step to read
        self._heap_read_s = 0.0  # CPU: what the last end-of-step heap read took
        self._heap_every = 1  # CPU: the end-of-step heap read is taken every this many steps
        # CPU: the last reads' costs; the cheapest rules (a read the scheduler interrupted is
        # slow once, a fragmented heap's read is slow every time)
        self._read_costs: deque[float] = deque(maxlen=4)
        self._heap_since = 0  # CPU: steps since it was last taken
        self._last_heap: tuple[int, int] | None = None
        self.heap_reads_skipped = 0  # CPU: end-of-step heap reads left out (budget) so far
        self.mid_step_reads = 0  # CPU: mid-step heap reads taken / skipped (budget) so far
        self.mid_step_skipped = 0
        self._read_at_s: float | None = None  # CUDA: perf_counter at the last read (the period)
        self.host_heap_reads = 0  # CUDA: end-of-step host heap reads taken so far

    @property
    def counter_source(self) -> str:
        """Where allocated/reserved come from, in words for the help screen and reports."""
        if self.is_cuda:
            return "torch.cuda caching allocator"
        return "glibc heap (mallinfo2)" if _MALLINFO2 is not None else "unavailable"

    def reset_peak(self) -> None:
        """Start the run's peak over (after warmup, so model set-up does not pollute it)."""
        self._run_peak = None
        self._since_reset = 0
        self.begin_step()

    def begin_step(self) -> None:
        """Start this step's peak: the allocator's high-water mark on CUDA (host bookkeeping,
        no sync; note it resets *all* of torch's peak stats, which a loop reading
        max_memory_allocated itself would see). On CPU no read: in a live run a mallinfo2
        walk costs ~100 µs (README), so the step's peak is its mid-step and end readings."""
        cuda = self._cuda
        if cuda is not None:
            cuda.reset_peak()
            return
        self._step_peak = None
        self._steps += 1
        self._since_reset += 1
        self._began_s = time.perf_counter()

    def observe_peak(self, budgeted: bool = False) -> None:
        """CPU only: fold one extra heap reading into the sampled peak, mid-step. ``budgeted``
        (the Monitor's own read at the end of each forward): only while it is cheap against
        the step (``MID_STEP_BUDGET``: 0.2%), or one of the first steps after a reset, or every
        ``MID_STEP_EVERY``-th step."""
        if self.is_cuda:
            return  # the CUDA allocator keeps a true high-water mark itself
        if budgeted and (self._heap_every > 1 or (
                self._heap_read_s > MID_STEP_BUDGET * self._step_s
                and self._since_reset > MID_STEP_FIRST and self._steps % MID_STEP_EVERY)):
            self.mid_step_skipped += 1
            return
        self.mid_step_reads += 1
        heap = heap_counters()
        if heap is not None and (self._step_peak is None or heap[0] > self._step_peak):
            self._step_peak = heap[0]

    def saw_heap(self, in_use_bytes: int | None) -> None:
        """CPU: a heap reading another instrument took mid-step (the ledger's at the end of
        forward), folded into this step's sampled peak like the Monitor's own: the run's peak
        is then never below a reading a report shows beside it."""
        if in_use_bytes is not None and not self.is_cuda and (
                self._step_peak is None or in_use_bytes > self._step_peak):
            self._step_peak = in_use_bytes

    def _fold(self, step_peak: int | None, count: bool = True) -> int | None:
        if not count:
            return self._run_peak
        if step_peak is not None and (self._run_peak is None or step_peak > self._run_peak):
            self._run_peak = step_peak
        return self._run_peak

    def read(self, count_peak: bool = True) -> MemoryReading:
        """The step's end. ``count_peak`` False (a step the profiler traced: see
        probes/records/step.py ``counts_toward_peak``) keeps its high-water mark out of the
        run's peak; the step's own peak is still in ``step_peak_allocated_bytes``."""
        rss = self._rss.read()
        cuda = self._cuda
        if cuda is not None:
            st = cuda.read()
            heap = self._cuda_host_heap() if self.host_heap else None
            if st is None:
                return MemoryReading(None, None, None, rss, host_heap_bytes=heap)
            return MemoryReading(st.allocated_bytes, st.reserved_bytes,
                                 self._fold(st.peak_allocated_bytes, count_peak), rss,
                                 st.peak_allocated_bytes, st.inactive_split_bytes,
                                 st.alloc_retries, st.ooms, True, heap)
        t0 = time.perf_counter()
        self._heap_since += 1
        fresh = self._heap_since >= self._heap_every or self._last_heap is None
        if fresh:
            heap = heap_counters()
            t1 = time.perf_counter()
            self._heap_read_s, self._step_s = t1 - t0, t0 - self._began_s
            self._read_costs.append(self._heap_read_s)
            # a read under the floor (a healthy heap) is the every-step case without the call;
            # the floor is read here, not bound as the default (tests/conftest.py sets it)
            self._heap_every = 1 if self._heap_read_s <= HEAP_READ_FLOOR_S else \
                heap_read_every(min(self._read_costs), self._step_s, HEAP_READ_FLOOR_S)
            self._heap_since, self._last_heap = 0, heap
        else:
            heap = self._last_heap
            self.heap_reads_skipped += 1
        if heap is None:
            return MemoryReading(None, None, None, rss)
        allocated, reserved = heap
        if self._step_peak is None or allocated > self._step_peak:
            self._step_peak = allocated
        return MemoryReading(allocated, reserved, self._fold(self._step_peak, count_peak), rss,
                             step_peak_allocated_bytes=self._step_peak, heap_fresh=fresh)

    def _cuda_host_heap(self) -> int | None:
        """CUDA: the host heap in use at its budgeted rate (CUDA_HEAP_READ_BUDGET of the
        period between reads); None on the steps between and where mallinfo2 is missing."""
        now = time.perf_counter()
        period = now - self._read_at_s if self._read_at_s is not None else 0.0
        self._read_at_s = now
        self._heap_since += 1
        if self._heap_since < self._heap_every:
            return None
        heap = heap_counters()
        cost = time.perf_counter() - now
        self._read_costs.append(cost)
        self.host_heap_reads += 1
        self._heap_since = 0
        self._heap_every = heap_read_every(min(self._read_costs), period,
                                           CUDA_HEAP_READ_FLOOR_S, CUDA_HEAP_READ_BUDGET,
                                           CUDA_HEAP_READ_MAX_EVERY) if period > 0 else 1
        return heap[0] if heap is not None else None

    def close(self) -> None:
        self._rss.close()


def guard_trip(watched: dict[str, int | None], prev: dict[str, int | None] | None,
               limit: int | None) -> tuple[str, int, int] | None:
    """(counter, bytes, growth per step) of the first watched counter that would pass ``limit``
    at the next step if it grew as it did in this one; None while all stay below."""
    if limit is None:
        return None
    for name, value in watched.items():
        if value is None:
            continue
        before = (prev or {}).get(name)
        growth = max(0, value - before) if before is not None else 0
        if value + growth > limit:
            return name, value, growth
    return None
