"""A profiler's Chrome/Kineto trace read without torch, and its events summed into one row per
op the way ``prof.key_averages()`` does.

Why not ``prof.key_averages()``: for ~13k events it runs ~0.6 s of Python that holds the GIL, and a
dashboard thread in the same process froze 150-250 ms while it ran. This module repeats the same
arithmetic on trace.json in plain Python, so it can run in a child process
(probes/traces/worker.py) that imports no torch and shares no GIL with training.

The rules are those of torch 2.13 (torch/autograd/profiler.py ``_parse_kineto_results`` and
profiler_util.py ``EventList``): utility ops are dropped, ``ProfilerStep#N`` becomes
``ProfilerStep*``, CPU events nest by time interval per thread, a lone child with its parent's
name is folded into the parent, [memory] records inside an event's interval count as its memory.
Rows are keyed by (name, CPU or device, user annotation), like key_averages() without shape
grouping; every kernel, memcpy and memset keeps a row of its own, as in torch's table.

Device time goes to the CPU op that launched it. torch links them inside the profiler; a trace
file says it in one of two ways, depending on the Kineto that wrote it (docs/ARCHITECTURE.md,
"Profiler window"):

- newer Kineto puts the launching op's ``External id`` on the kernel (it differs from the
  kernel's ``correlation``);
- older Kineto writes only ``correlation`` (its "External id" is the correlation again): the
  kernel's correlation names a ``cuda_runtime`` call (cudaLaunchKernel, cudaMemcpyAsync, ...),
  and the launching op is the innermost CPU op enclosing that call on the same thread.

Both are followed, the first where present. Device events are found from the trace itself (their
categories, or a process labelled "GPU N"), so no flag says whether a trace has any, and the
totals reconcile: the device time launched by all CPU ops plus the device time no op launched
equals the trace's kernel + memcpy + memset time (``DeviceTime``). ``cuda_sync`` spans sit on
the device rows but are waits, not work: they are left out.
"""

from __future__ import annotations

import bisect
import gzip
import json
import os
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

FILTERED_NAMES = frozenset({
    "[memory]", "[OutOfMemory]", "profiler::_record_function_enter",
    "profiler::_record_function_enter_new", "profiler::_record_function_exit",
    "aten::is_leaf", "aten::output_nr", "aten::_version",
})
# Work on the device: what "device time" sums (the trace's kernel + memcpy + memset time).
DEVICE_WORK_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
# Kineto categories of events on the device's rows that get a row of their own.
DEVICE_CATS = DEVICE_WORK_CATS | {"gpu_user_annotation", "mtia_ccp_events",
                                  "gpu_instant_event"}
DEVICE_WAIT_CATS = frozenset({"cuda_sync"})  # a stream or event wait: not work, no row
# Host-side calls into the runtime or driver: a kernel's correlation names one of them.
LINKED_HOST_CATS = frozenset({"cuda_runtime", "cuda_driver", "privateuse1_runtime",
                              "privateuse1_driver", "xpu_runtime", "mtia_runtime"})
NOT_LAUNCHERS = LINKED_HOST_CATS | {"python_function"}  # no correlation is pushed for these
NOT_EVENTS = frozenset({"Trace", "fwdbwd", "ac2g", "cpu_instant_event"})
USER_ANNOTATION_CATS = frozenset({"user_annotation", "gpu_user_annotation"})
# torch DeviceType values: memory counted as CPU memory or device memory.
CPU_MEMORY_TYPES = frozenset({0, 2, 5})  # CPU, MKLDNN, IDEEP
DEVICE_MEMORY_TYPES = frozenset({1, 6, 12, 20})  # CUDA, HIP, XPU, PrivateUse1


class _Ns(int):
    """Nanoseconds parsed exactly from a JSON number written in microseconds (ts, dur)."""


def _parse_float(text: str) -> _Ns:
    whole, dot, frac = text.partition(".")
    if whole.isdigit() and (not dot or (frac.isdigit() and len(frac) <= 3)):
        return _Ns(int(whole) * 1000 + int((frac + "000")[:3]))
    return _Ns(round(Decimal(text) * 1000))


def _ns(value: Any) -> int:
    if isinstance(value, _Ns):
        return value
    if isinstance(value, int):
        return value * 1000
    return round(float(value) * 1000)  # a trace read by plain json.load: nearest ns


def load_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read trace.json or trace.json.gz with times kept as exact integer nanoseconds."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return json.load(fh, parse_float=_parse_float)


@dataclass(frozen=True)
class DeviceTime:
    """Where a trace's device time went: ``total_us`` (kernel + memcpy + memset) equals
    ``launched_us`` (credited to the CPU ops that launched it) + ``unattributed_us``."""

    total_us: float
    launched_us: float
    unattributed_us: float
    unattributed_events: int
    by_category_us: dict[str, float]
    linked_by_external_id: int  # device events linked through the op's External id
    linked_by_correlation: int  # through correlation -> runtime call -> enclosing op

    def line(self) -> str:
        """The reconciliation as one sentence, under the table."""
        parts = ", ".join(f"{k.removeprefix('gpu_')} {_ms(v)}"
                          for k, v in sorted(self.by_category_us.items()))
        return (f"device time {_ms(self.total_us)} ({parts}) = {_ms(self.launched_us)} "
                f"launched by CPU ops + {_ms(self.unattributed_us)} no op launched "
                f"({self.unattributed_events} events); linked by External id "
                f"{self.linked_by_external_id}, by correlation {self.linked_by_correlation}")


def _ms(us: float) -> str:
    return f"{us / 1000:,.3f} ms"


@dataclass(frozen=True)
class TraceOps:
    """A trace summed per op: the rows, its device time (None without device events), whether
    it has [memory] records, and the GPU its deviceProperties name."""

    rows: list[dict[str, Any]]
    device: DeviceTime | None
    has_memory: bool
    gpu: str | None


class _Ev:
    __slots__ = ("name", "cpu", "annotation", "thread", "start", "end", "ext_id", "corr",
                 "cat", "kernels", "children", "parent", "cpu_mem", "dev_mem", "dev_total",
                 "self_dev")

    def __init__(self, name: str, cpu: bool, annotation: bool, thread: Any, start: int,
                 end: int, ext_id: int, corr: int = 0, cat: Any = None) -> None:
        self.name = name
        self.cpu = cpu
        self.annotation = annotation
        self.thread = thread
        self.start = start
        self.end = end
        self.ext_id = ext_id
        self.corr = corr
        self.cat = cat
        self.kernels: list[int] = []
        self.children: list[_Ev] = []
        self.parent: _Ev | None = None
        self.cpu_mem = 0
        self.dev_mem = 0
        self.dev_total = 0
        self.self_dev = 0

    @property
    def launcher(self) -> bool:
        """A CPU op torch links kernels to (not a runtime call, not a Python frame)."""
        return self.cpu and self.cat not in NOT_LAUNCHERS and self.name not in (
            "[memory]", "[OutOfMemory]")


def gpu_pids(trace: dict[str, Any]) -> set[Any]:
    """The trace's process ids that Kineto labels as a GPU ("GPU 0", ...)."""
    return {e.get("pid") for e in trace.get("traceEvents", [])
            if e.get("ph") == "M" and e.get("name") == "process_labels"
            and str(e.get("args", {}).get("labels", "")).startswith("GPU")}


def _int_arg(args: dict[str, Any], key: str) -> int:
    value = args.get(key, 0)
    return value if isinstance(value, int) and value > 0 else 0


def read_ops(trace: dict[str, Any], use_device: bool | None = None,
             profile_memory: bool | None = None) -> TraceOps:
    """One row per op like key_averages(): calls, self/total CPU and device time, memory.

    ``use_device`` / ``profile_memory``: None finds out from the trace (device events, [memory]
    records); True or False forces the columns on or off."""
    events: list[_Ev] = []
    device_work: list[_Ev] = []
    runtime_by_corr: dict[int, _Ev] = {}
    ops_by_ext: dict[int, _Ev] = {}
    mem: list[tuple[int, int, int, Any]] = []  # (ts ns, bytes, device type, thread)
    oom: list[tuple[int, int, int, Any]] = []
    on_gpu = gpu_pids(trace)
    for raw in trace.get("traceEvents", []):
        ph = raw.get("ph")
        name = raw.get("name", "")
        cat = raw.get("cat")
        if ph == "i" and name in ("[memory]", "[OutOfMemory]"):
            args = raw.get("args", {})
            record = (_ns(raw["ts"]), int(args.get("Bytes", 0)), int(args.get("Device Type", 0)),
                      raw.get("tid"))
            (mem if name == "[memory]" else oom).append(record)
            continue
        if ph != "X" or cat in NOT_EVENTS or cat in DEVICE_WAIT_CATS or name in FILTERED_NAMES:
            continue
        start = _ns(raw["ts"])
        end = start + _ns(raw.get("dur", 0))
        if name.startswith("ProfilerStep#"):
            name = "ProfilerStep*"
        args = raw.get("args", {})
        ext, corr = _int_arg(args, "External id"), _int_arg(args, "correlation")
        on_device = cat in DEVICE_CATS or (cat not in LINKED_HOST_CATS
                                           and raw.get("pid") in on_gpu)
        ev = _Ev(name, not on_device, cat in USER_ANNOTATION_CATS, raw.get("tid"), start, end,
                 ext, corr, cat)
        events.append(ev)
        if on_device:
            if cat in DEVICE_WORK_CATS:
                device_work.append(ev)
        elif cat in LINKED_HOST_CATS:
            if corr:
                runtime_by_corr.setdefault(corr, ev)
        elif ev.launcher and ext:
            ops_by_ext.setdefault(ext, ev)
    if use_device is None:
        use_device = bool(device_work)
    if profile_memory is None:
        profile_memory = bool(mem or oom)

    mem.sort(key=lambda r: r[0])
    if mem:
        _attach_memory(events, mem)
    for record in oom:
        events.append(_memory_event("[OutOfMemory]", record))
    for ev in events:  # a runtime call belongs to the thread of the op whose External id it has
        if ev.cat in LINKED_HOST_CATS and ev.ext_id and ev.ext_id != ev.corr:
            op = ops_by_ext.get(ev.ext_id)
            if op is not None:
                ev.thread = op.thread
    # children after their parents: start, then longest first, then the op made first (its
    # External id is lower), a runtime call innermost
    events.sort(key=lambda e: (e.start, -e.end, e.cat in LINKED_HOST_CATS, e.ext_id))
    _build_tree(events)
    device = _attribute(device_work, runtime_by_corr, ops_by_ext)
    events = _fold_duplicates(events)
    rows = _average(events, use_device, profile_memory)
    props = trace.get("deviceProperties")
    gpu = props[0].get("name") if isinstance(props, list) and props and isinstance(
        props[0], dict) else None
    return TraceOps(rows, device if device_work else None, bool(mem or oom), gpu)


def aggregate(trace: dict[str, Any], use_device: bool | None = None,
              profile_memory: bool | None = None) -> list[dict[str, Any]]:
    """The rows of ``read_ops`` (the table without its device-time reconciliation)."""
    return read_ops(trace, use_device, profile_memory).rows


def _launching_op(ev: _Ev | None) -> _Ev | None:
    """The innermost op enclosing ``ev`` on its thread that torch would link a launch to."""
    while ev is not None and not ev.launcher:
        ev = ev.parent
    return ev


def _attribute(device_work: list[_Ev], runtime_by_corr: dict[int, _Ev],
               ops_by_ext: dict[int, _Ev]) -> DeviceTime:
    """Credit every kernel / memcpy / memset to the CPU op that launched it (module docstring);
    what no op launched is counted, so the totals reconcile."""
    by_ext = by_corr = unattributed_events = 0
    total = unattributed = 0
    by_cat: dict[str, int] = defaultdict(int)
    for dev in device_work:
        dur = dev.end - dev.start
        total += dur
        by_cat[str(dev.cat)] += dur
        op = None
        if dev.ext_id and dev.ext_id != dev.corr:  # newer Kineto: the op's own id
            op = ops_by_ext.get(dev.ext_id)
            by_ext += op is not None
        if op is None and dev.corr:  # older Kineto: the runtime call, then its enclosing op
            runtime = runtime_by_corr.get(dev.corr)
            op = _launching_op(runtime.parent) if runtime is not None else None
            by_corr += op is not None
        if op is None:
            unattributed += dur
            unattributed_events += 1
        else:
            op.kernels.append(dur)
    launched = total - unattributed
    return DeviceTime(total / 1000.0, launched / 1000.0, unattributed / 1000.0,
                      unattributed_events, {k: v / 1000.0 for k, v in by_cat.items()},
                      by_ext, by_corr)


def _attach_memory(events: list[_Ev], mem: list[tuple[int, int, int, Any]]) -> None:
    """Each CPU event owns the [memory] records whose time lies in [start, end] (any thread)."""
    times = [r[0] for r in mem]
    cpu_prefix = [0]
    dev_prefix = [0]
    for _, nbytes, dtype, _tid in mem:
        cpu_prefix.append(cpu_prefix[-1] + (nbytes if dtype in CPU_MEMORY_TYPES else 0))
        dev_prefix.append(dev_prefix[-1] + (nbytes if dtype in DEVICE_MEMORY_TYPES else 0))
    covered = [0] * (len(mem) + 1)
    for ev in events:
        if not ev.cpu:
            continue
        lo = bisect.bisect_left(times, ev.start)
        hi = bisect.bisect_right(times, ev.end)
        if hi > lo:
            ev.cpu_mem = cpu_prefix[hi] - cpu_prefix[lo]
            ev.dev_mem = dev_prefix[hi] - dev_prefix[lo]
            covered[lo] += 1
            covered[hi] -= 1
    depth = 0
    for i, (t, nbytes, dtype, tid) in enumerate(mem):
        depth += covered[i]
        if depth == 0:  # a record outside every event becomes a "[memory]" row of its own
            events.append(_memory_event("[memory]", (t, nbytes, dtype, tid)))


def _memory_event(name: str, record: tuple[int, int, int, Any]) -> _Ev:
    t, nbytes, dtype, tid = record
    ev = _Ev(name, True, False, tid, t, t, 0)
    ev.cpu_mem = nbytes if dtype in CPU_MEMORY_TYPES else 0
    ev.dev_mem = nbytes if dtype in DEVICE_MEMORY_TYPES else 0
    return ev


def _build_tree(events: list[_Ev]) -> None:
    """Per thread, an event is the child of the innermost earlier event that contains it."""
    by_thread: dict[Any, list[_Ev]] = defaultdict(list)
    for ev in events:
        if ev.cpu:
            by_thread[ev.thread].append(ev)
    for thread_events in by_thread.values():
        stack: list[_Ev] = []
        for ev in thread_events:
            while stack:
                parent = stack[-1]
                if ev.start >= parent.end or ev.end > parent.end:
                    stack.pop()
                else:
                    parent.children.append(ev)
                    ev.parent = parent
                    break
            stack.append(ev)


def _fold_duplicates(events: list[_Ev]) -> list[_Ev]:
    """A lone child named like its parent is the same op seen twice: keep the parent only,
    with the child's children and kernels (torch moves the kernels up; a parent with a lone
    child launched none itself, so nothing is lost)."""
    while True:
        drop: set[int] = set()
        for i, ev in enumerate(events):
            parent = ev.parent
            if parent is not None and parent.name == ev.name and len(parent.children) == 1:
                parent.children = ev.children
                parent.kernels = parent.kernels + ev.kernels
                for child in ev.children:
                    child.parent = parent
                drop.add(i)
        if not drop:
            return events
        events = [ev for i, ev in enumerate(events) if i not in drop]


def _average(events: list[_Ev], use_device: bool,
             profile_memory: bool) -> list[dict[str, Any]]:
    if use_device:  # children start after their parents: reversed order sees children first
        for ev in reversed(events):
            if ev.cpu:
                kids = sum(c.dev_total for c in ev.children)
                ev.dev_total = sum(ev.kernels) + kids
                ev.self_dev = ev.dev_total - kids
            else:
                ev.dev_total = ev.self_dev = ev.end - ev.start
    stats: dict[tuple[str, bool, bool], list[int]] = {}
    order: list[tuple[str, bool, bool]] = []
    for ev in events:
        key = (ev.name, ev.cpu, ev.annotation)
        acc = stats.get(key)
        if acc is None:
            acc = stats[key] = [0, 0, 0, 0, 0, 0, 0]
            order.append(key)
        acc[0] += 1
        if ev.cpu:
            total = ev.end - ev.start
            acc[1] += total - sum(c.end - c.start for c in ev.children)
            acc[2] += total
        acc[3] += ev.self_dev
        acc[4] += ev.dev_total
        acc[5] += ev.cpu_mem
        acc[6] += ev.dev_mem
    rows = []
    for key in order:
        calls, self_cpu, cpu_total, self_dev, dev_total, cpu_mem, dev_mem = stats[key]
        rows.append({
            "name": key[0], "calls": calls,
            "self_cpu_us": self_cpu / 1000.0, "cpu_total_us": cpu_total / 1000.0,
            "self_device_us": self_dev / 1000.0 if use_device else None,
            "device_total_us": dev_total / 1000.0 if use_device else None,
            "cpu_memory_bytes": cpu_mem if profile_memory else None,
            "device_memory_bytes": dev_mem if profile_memory and use_device else None,
            "user_annotation": key[2], "on_device": not key[1],
        })
    return rows
