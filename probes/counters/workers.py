"""The training process's children — DataLoader workers and any other — read from /proc on a
sampler thread about once a second, so the step path only picks up the latest reading (as the
NVML poller's, probes/counters/nvml.py).

Each child's memory comes from ``/proc/<pid>/smaps_rollup``: RSS (its resident pages, shared ones
counted whole), PSS (its own pages plus its share of each shared page: summed over processes it
counts a shared page once) and USS (``Private_Clean + Private_Dirty``: the pages only it maps,
what it would give back if it ended). Forked workers share the trainer's pages copy-on-write, so
their RSS sums count those pages once per worker; PSS and USS do not.

Why /proc and not psutil: no new runtime dependency, and no walk of every process the box runs
where the kernel lists a task's children (``/proc/<pid>/task/<tid>/children``, ~0.6 ms for a
trainer and 8 workers); where it does not (CONFIG_PROC_CHILDREN off) one pass over
``/proc/*/stat`` finds them (~12 µs a process: ~1 ms with 80 processes). psutil reads the same
files (smaps_rollup for ``memory_full_info``) and walks every process for ``children()``.

What a reading costs is the kernel's walk of each worker's page tables for smaps_rollup: ~4 ms
for a forked worker of a torch process (~190 MiB resident), more for bigger ones
(benchmarks/cases/step_cost/workers_sampler.py); the read releases the GIL and never runs on the
step path, so the training thread only shares a core with it. ``interval_s`` sets the pace.

A worker is a direct child; what it starts (an ``ldconfig`` while a spawned worker imports, a
tokenizer's helpers) is added to it, never counted as a worker of its own. Left out, and said so
in the ``workers`` event: memtop's own profiler-analysis child (``exclude``:
probes/traces/worker.py's pids) and multiprocessing's helper processes (the resource tracker
and the forkserver a spawn-started DataLoader brings along), each with the processes they
started. A child that cannot be read (gone between the list and the read) is
dropped from that reading; one seen as a zombie has its exit status read before it is reaped.
Everything here is torch-free; a platform without /proc reads None (shown "n/a").
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from probes.counters.proctree import (
    MAX_DEPTH,
    PROC,
    ChildLister,
    added,
    exit_text,
    read_cmdline,
    read_memory,
    read_stat,
)

ANALYSIS = "memtop's profiler analysis (probes/traces/worker.py)"
HELPERS = {b"multiprocessing.resource_tracker": "multiprocessing's resource tracker",
           b"multiprocessing.forkserver": "multiprocessing's forkserver",
           b"probes.traces.opstable": ANALYSIS}  # also before its Popen is registered
DATALOADER_COMM = "pt_data_worker"  # the name torch's worker loop gives its process


@dataclass(frozen=True, slots=True)
class ChildMemory:
    """One counted child at one reading."""

    pid: int
    comm: str  # its name: "pt_data_worker" for a DataLoader worker
    rss_bytes: int | None
    pss_bytes: int | None  # None where smaps_rollup cannot be read (RSS from statm then)
    uss_bytes: int | None
    first_uss_bytes: int | None  # at the first reading that saw it
    age_s: float  # since the first reading that saw it

    @property
    def private_bytes(self) -> int | None:
        """USS, or RSS where the kernel gives no smaps_rollup (coarser: shared pages in)."""
        return self.uss_bytes if self.uss_bytes is not None else self.rss_bytes


@dataclass(frozen=True)
class WorkersReading:
    """The counted children at one reading: their number and summed bytes (0 without any)."""

    seq: int  # readings taken so far: a new one has a new seq
    taken_s: float  # time.perf_counter() when it was taken
    generation: int  # bumped whenever the set of counted children changes
    children: tuple[ChildMemory, ...]
    rss_bytes: int | None
    pss_bytes: int | None
    uss_bytes: int | None
    fields: dict[str, int | None] = field(default_factory=dict)  # step_fields, made once

    @property
    def workers(self) -> int:
        return len(self.children)

    @property
    def private_bytes(self) -> int | None:
        """What the leak watch and the guard add to the trainer: USS (RSS where no rollup)."""
        return self.uss_bytes if self.uss_bytes is not None else self.rss_bytes

    def step_fields(self) -> dict[str, int | None]:
        """This reading under its StepSample field names (probes/records/step.py)."""
        return self.fields

    def growth_by_child(self) -> dict[int, int]:
        """pid -> private bytes grown since the child was first seen (USS where read)."""
        return {c.pid: c.private_bytes - c.first_uss_bytes for c in self.children
                if c.private_bytes is not None and c.first_uss_bytes is not None}


@dataclass(frozen=True)
class ChildChange:
    """A counted child started or ended, or a child left out: the ``workers`` event's items."""

    what: str  # "started" | "ended" | "left_out"
    pid: int
    comm: str
    time_s: float  # perf_counter of the reading that saw it
    rss_bytes: int | None = None
    pss_bytes: int | None = None
    uss_bytes: int | None = None
    peak_uss_bytes: int | None = None  # ended: the most it held
    lived_s: float | None = None  # ended: since first seen
    exit: str | None = None  # ended: "exit 0", "killed by signal 9"; None when reaped unseen
    why: str | None = None  # left out: whose it is


@dataclass
class _Known:
    """What the sampler remembers of one counted child between readings."""

    comm: str
    start_ticks: int
    first_s: float
    first_uss: int | None
    last: tuple[int | None, int | None, int | None] = (None, None, None)
    peak_uss: int | None = None


# ---- the sampler ------------------------------------------------------------------------------
class ProcessTreeSampler:
    """Reads ``pid``'s children every ``interval_s`` on a daemon thread; ``latest`` (a
    WorkersReading) is safe to read from any thread; ``take_changes()`` hands over the starts,
    ends and left-out children seen since the last call, in order. ``exclude()`` gives pids
    that are memtop's own (left out with their children)."""

    def __init__(self, pid: int | None = None, interval_s: float = 1.0,
                 exclude: Callable[[], Iterable[int]] = tuple) -> None:
        if not interval_s > 0:
            raise ValueError(f"the workers' sampling period must be above 0 s, got {interval_s}")
        self.pid = pid if pid is not None else os.getpid()
        self.interval_s = float(interval_s)
        self.exclude = exclude
        self.available = os.path.isdir(f"{PROC}/{self.pid}")
        self.lister = ChildLister(self.pid)
        self.latest: WorkersReading | None = None
        self.error: str | None = None if self.available else "no /proc: workers not read"
        self.read_s = 0.0  # time spent reading, in all (the benchmark's CPU figure)
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._known: dict[int, _Known] = {}
        self._left_out: dict[int, int] = {}  # pid -> start ticks, said once
        self._changes: deque[ChildChange] = deque()
        self._generation = 0
        self._seq = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # what the step path and the instruments read -----------------------------------------------
    @property
    def has_changes(self) -> bool:
        return bool(self._changes)

    def take_changes(self) -> list[ChildChange]:
        out = []
        while self._changes:
            out.append(self._changes.popleft())
        return out

    def wait_for_reading(self, after_seq: int, timeout_s: float) -> WorkersReading | None:
        """The first reading with ``seq > after_seq``, waiting up to ``timeout_s`` (tests and
        benchmarks pace a loop on it); None on timeout."""
        with self._cond:
            self._cond.wait_for(lambda: self.latest is not None
                                and self.latest.seq > after_seq, timeout_s)
            latest = self.latest
        return latest if latest is not None and latest.seq > after_seq else None

    # the thread ---------------------------------------------------------------------------------
    def start(self) -> None:
        """The first reading now, then one every ``interval_s`` on the thread."""
        if not self.available or self._thread is not None:
            return
        self.read_once()
        self._thread = threading.Thread(target=self._run, name="memtop-workers", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.read_once()
            except Exception as exc:  # never the run's failure: the fields read None
                self.error = f"workers not read: {type(exc).__name__}: {exc}"
                self.latest = None
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    # one reading --------------------------------------------------------------------------------
    def read_once(self) -> WorkersReading:
        t0 = time.perf_counter()
        counted, zombies = self._tree()
        now = time.perf_counter()
        children: list[ChildMemory] = []
        seen: set[int] = set()
        for pid, (comm, start_ticks, below) in counted.items():
            known = self._known.get(pid)
            if known is not None and known.start_ticks != start_ticks:
                self._ended(pid, known, now, None)  # the pid was reused
                known = None
            mem = read_memory(pid, self._page)
            if mem is None:
                continue  # gone since it was listed: ended at the next reading
            for kid in below:  # what the worker started is the worker's
                mem = added(mem, read_memory(kid, self._page))
            rss, pss, uss = mem
            if known is None:
                known = self._known[pid] = _Known(comm, start_ticks, now,
                                                  uss if uss is not None else rss)
                self._changes.append(ChildChange("started", pid, comm, now, rss, pss, uss))
                self._generation += 1
            known.comm = comm
            known.last = mem
            private = uss if uss is not None else rss
            if private is not None and (known.peak_uss is None or private > known.peak_uss):
                known.peak_uss = private
            seen.add(pid)
            children.append(ChildMemory(pid, comm, rss, pss, uss, known.first_uss,
                                        now - known.first_s))
        for pid in [p for p in self._known if p not in seen]:
            self._ended(pid, self._known[pid], now, zombies.get(pid))
        reading = self._reading(now, children)
        self.read_s += time.perf_counter() - t0
        with self._cond:
            self.latest = reading
            self._cond.notify_all()
        return reading

    def _reading(self, now: float, children: list[ChildMemory]) -> WorkersReading:
        def total(values: list[int | None]) -> int | None:
            return None if any(v is None for v in values) else sum(v for v in values
                                                                   if v is not None)

        rss = total([c.rss_bytes for c in children])
        pss = total([c.pss_bytes for c in children])
        uss = total([c.uss_bytes for c in children])
        self._seq += 1
        return WorkersReading(
            self._seq, now, self._generation, tuple(children), rss, pss, uss,
            {"workers": len(children), "workers_rss_bytes": rss, "workers_pss_bytes": pss,
             "workers_uss_bytes": uss})

    def _ended(self, pid: int, known: _Known, now: float, exit_code: int | None) -> None:
        del self._known[pid]
        rss, pss, uss = known.last
        self._changes.append(ChildChange(
            "ended", pid, known.comm, now, rss, pss, uss, peak_uss_bytes=known.peak_uss,
            lived_s=round(now - known.first_s, 3), exit=exit_text(exit_code)))
        self._generation += 1

    def _tree(self) -> tuple[dict[int, tuple[str, int, list[int]]], dict[int, int | None]]:
        """(counted child -> (comm, start ticks, its own descendants), zombie -> its exit
        code): the direct children of ``pid`` that are not left out, each with the processes
        it started (a worker's ``ldconfig`` while it imports, a tokenizer's helpers: their
        memory is the worker's; they are never counted as workers of their own). A zombie
        (ended, not reaped yet) is not counted: its exit code is kept for its ``ended``."""
        kids = self.lister.children_map()
        own: set[int] = set()
        for _ in range(3):  # a WeakSet the training thread adds to may change mid-iteration
            try:
                own = set(self.exclude())
                break
            except Exception:
                continue
        counted: dict[int, tuple[str, int, list[int]]] = {}
        zombies: dict[int, int | None] = {}
        for pid in kids.get(self.pid, ()):
            stat = read_stat(pid)
            if stat is None:
                continue
            comm, state, _ppid, start_ticks, exit_code = stat
            if state in ("Z", "X"):
                zombies[pid] = exit_code
                continue
            why = ANALYSIS if pid in own else self._helper(pid, start_ticks)
            if why is not None:
                self._say_left_out(pid, comm, start_ticks, why)
                continue
            below: list[int] = []
            todo = [(kid, 2) for kid in kids.get(pid, ())]
            while todo:
                kid, depth = todo.pop()
                below.append(kid)
                if depth < MAX_DEPTH:
                    todo += [(grand, depth + 1) for grand in kids.get(kid, ())]
            counted[pid] = (comm, start_ticks, below)
        return counted, zombies

    def _helper(self, pid: int, start_ticks: int) -> str | None:
        """Whose helper process ``pid`` is (multiprocessing's), read once per process."""
        if pid in self._known and self._known[pid].start_ticks == start_ticks:
            return None  # counted before: a worker stays one
        if self._left_out.get(pid) == start_ticks:
            return "left out"
        cmdline = read_cmdline(pid)
        return next((why for marker, why in HELPERS.items() if marker in cmdline), None)

    def _say_left_out(self, pid: int, comm: str, start_ticks: int, why: str) -> None:
        if self._left_out.get(pid) == start_ticks:
            return
        self._left_out[pid] = start_ticks
        self._changes.append(ChildChange("left_out", pid, comm, time.perf_counter(), why=why))

    def describe(self) -> str:
        """What is counted and how, for run_started and the report."""
        if not self.available:
            return "n/a (no /proc)"
        return (f"child processes of pid {self.pid} (DataLoader workers and any other; "
                f"memtop's profiler-analysis child and multiprocessing's helpers left out), "
                f"found by {self.lister.how}, every {self.interval_s:g} s; RSS, PSS and USS "
                f"from /proc/PID/smaps_rollup")
