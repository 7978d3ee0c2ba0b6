"""A profiler's Chrome/Kineto trace read without torch, and its events summed into one row per
op the way ``prof.key_averages()`` does.

Why not ``prof.key_averages()``: for ~13k events it runs ~0.6 s of Python that holds the GIL, and a
dashboard thread in the same process froze 150-250 ms while it ran. This module repeats the same
arithmetic on trace.json in plain Python, so it can run in a child process
(probes/traces/worker.py) that imports no torch and shares no GIL with training.

The rules are those of torch 2.13 (torch/autograd/profiler.py ``_parse_kineto_results`` and
profiler_util.py ``EventList``): utility ops are dropped, ``ProfilerStep#N`` becomes
``ProfilerStep*``, CPU events nest by time interval per thread, a lone child with its parent's
name is folded into the parent, [memory] records inside an event's interval count as its memory,
and device kernels count towards the CPU op whose "External id" launched them. Rows are keyed by
(name, CPU or device, user annotation), like key_averages() without shape grouping.
"""

from __future__ import annotations

import bisect
import gzip
import json
import os
from collections import defaultdict
from decimal import Decimal
from typing import Any

FILTERED_NAMES = frozenset({
    "[memory]", "[OutOfMemory]", "profiler::_record_function_enter",
    "profiler::_record_function_enter_new", "profiler::_record_function_exit",
    "aten::is_leaf", "aten::output_nr", "aten::_version",
})
# Kineto categories of events that run on the device (GPU timeline rows).
DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation",
                         "mtia_ccp_events", "gpu_instant_event"})
# Host-side events whose "External id" points at the op that caused them, not at themselves.
LINKED_HOST_CATS = frozenset({"cuda_runtime", "cuda_driver", "privateuse1_runtime",
                              "privateuse1_driver", "xpu_runtime", "mtia_runtime"})
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


class _Ev:
    __slots__ = ("name", "cpu", "annotation", "thread", "start", "end", "ext_id", "kernels",
                 "children", "parent", "cpu_mem", "dev_mem", "dev_total", "self_dev")

    def __init__(self, name: str, cpu: bool, annotation: bool, thread: Any, start: int,
                 end: int, ext_id: int) -> None:
        self.name = name
        self.cpu = cpu
        self.annotation = annotation
        self.thread = thread
        self.start = start
        self.end = end
        self.ext_id = ext_id
        self.kernels: list[int] = []
        self.children: list[_Ev] = []
        self.parent: _Ev | None = None
        self.cpu_mem = 0
        self.dev_mem = 0
        self.dev_total = 0
        self.self_dev = 0


def aggregate(trace: dict[str, Any], use_device: bool = False,
              profile_memory: bool = False) -> list[dict[str, Any]]:
    """One row per op like key_averages(): calls, self/total CPU and device time, memory."""
    events: list[_Ev] = []
    linked: dict[int, list[_Ev]] = defaultdict(list)
    mem: list[tuple[int, int, int, Any]] = []  # (ts ns, bytes, device type, thread)
    oom: list[tuple[int, int, int, Any]] = []
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
        if ph != "X" or cat in NOT_EVENTS or name in FILTERED_NAMES:
            continue
        start = _ns(raw["ts"])
        end = start + _ns(raw.get("dur", 0))
        if name.startswith("ProfilerStep#"):
            name = "ProfilerStep*"
        ext = int(raw.get("args", {}).get("External id", 0) or 0)
        is_linked = cat in DEVICE_CATS or cat in LINKED_HOST_CATS
        ev = _Ev(name, cat not in DEVICE_CATS, cat in USER_ANNOTATION_CATS, raw.get("tid"),
                 start, end, 0 if is_linked else ext)
        if is_linked and ext > 0:
            linked[ext].append(ev)
        events.append(ev)

    mem.sort(key=lambda r: r[0])
    if mem:
        _attach_memory(events, mem)
    for record in oom:
        events.append(_memory_event("[OutOfMemory]", record))
    for ev in events:  # kernels count towards the CPU op that launched them
        if ev.cpu and ev.ext_id in linked:
            for other in linked[ev.ext_id]:
                if not other.cpu:
                    ev.kernels.append(other.end - other.start)
                else:
                    other.thread = ev.thread
    events.sort(key=lambda e: (e.start, -e.end))
    _build_tree(events)
    events = _fold_duplicates(events)
    return _average(events, use_device, profile_memory)


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
    """A lone child named like its parent is the same op seen twice: keep the parent only."""
    while True:
        drop: set[int] = set()
        for i, ev in enumerate(events):
            parent = ev.parent
            if parent is not None and parent.name == ev.name and len(parent.children) == 1:
                parent.children = ev.children
                parent.kernels = ev.kernels
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
