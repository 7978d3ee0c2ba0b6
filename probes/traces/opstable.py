"""The top-ops table of a profiler window, computed from its exported Chrome trace without torch.

Why not ``prof.key_averages()``: for ~13k events it runs ~0.6 s of Python that holds the GIL, and a
dashboard thread in the same process froze 150-250 ms while it ran. This module repeats the same
arithmetic on trace.json in plain Python, so it can run in a child process (``python -m
probes.traces.opstable``, or :func:`spawn_worker`) that imports no torch and shares no GIL with
training.

The rules are those of torch 2.13 (torch/autograd/profiler.py ``_parse_kineto_results`` and
profiler_util.py ``EventList``): utility ops are dropped, ``ProfilerStep#N`` becomes
``ProfilerStep*``, CPU events nest by time interval per thread, a lone child with its parent's
name is folded into the parent, [memory] records inside an event's interval count as its memory,
and device kernels count towards the CPU op whose "External id" launched them. Rows are keyed by
(name, CPU or device, user annotation), like key_averages() without shape grouping.
"""

from __future__ import annotations

import bisect
import contextlib
import gzip
import json
import os
import subprocess
import sys
import time
import weakref
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

from probes.runfolder.atomic import write_text
from probes.tools.units import format_bytes, format_us

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

ROW_FIELDS = ("name", "calls", "self_cpu_us", "cpu_total_us", "self_device_us",
              "device_total_us", "cpu_memory_bytes", "device_memory_bytes")
SORT_KEYS = {"cpu": "self_cpu_us", "device": "self_device_us"}


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


def rows_from_key_averages(averages: Any, use_device: bool,
                           profile_memory: bool) -> list[dict[str, Any]]:
    """torch's own key_averages() (FunctionEventAvg list) in this module's row format."""
    return [{
        "name": e.key, "calls": e.count,
        "self_cpu_us": float(e.self_cpu_time_total), "cpu_total_us": float(e.cpu_time_total),
        "self_device_us": float(e.self_device_time_total) if use_device else None,
        "device_total_us": float(e.device_time_total) if use_device else None,
        "cpu_memory_bytes": int(e.cpu_memory_usage) if profile_memory else None,
        "device_memory_bytes": (int(e.device_memory_usage) if profile_memory and use_device
                                else None),
        "user_annotation": bool(getattr(e, "is_user_annotation", False)),
        "on_device": getattr(getattr(e, "device_type", None), "name", "CPU") != "CPU",
    } for e in averages]


def rank_rows(rows: list[dict[str, Any]], sort_by: str) -> list[dict[str, Any]]:
    """The ops table's order. By device time, user annotations (ProfilerStep#, forward,
    backward, optimizer: record_function ranges and their gpu_user_annotation spans) are left
    out: a span covers every kernel inside it, idle gaps included, so it would top the table
    ahead of every kernel; ``phase_totals`` shows them instead."""
    if sort_by == "device":
        rows = [r for r in rows if not r.get("user_annotation")]
    return sort_rows(rows, sort_by)


def phase_totals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per user annotation: calls and CPU time of the host range, and the device span (first
    kernel start to last kernel end, gaps included) of its gpu_user_annotation twin."""
    phases: dict[str, dict[str, Any]] = {}
    for r in rows:
        if not r.get("user_annotation"):
            continue
        ph = phases.setdefault(r["name"], {"name": r["name"], "calls": 0, "cpu_total_us": None,
                                           "device_span_us": None})
        if r.get("on_device"):
            ph["device_span_us"] = r.get("device_total_us")
        else:
            ph["calls"] = r["calls"]
            ph["cpu_total_us"] = r["cpu_total_us"]
    return list(phases.values())


def format_phases(phases: list[dict[str, Any]]) -> str:
    """The phase totals under the ops table ("" when there are none)."""
    if not phases:
        return ""
    lines = [f"{'Phase (user annotation)':<40}{'CPU total':>14}{'Device span':>14}{'Calls':>9}"]
    for ph in phases:
        lines.append(f"{ph['name'][:38]:<40}{_us_cell(ph['cpu_total_us']):>14}"
                     f"{_us_cell(ph['device_span_us']):>14}{ph['calls']:>9}")
    return "\n".join(lines) + "\n"


def sort_rows(rows: list[dict[str, Any]], sort_by: str) -> list[dict[str, Any]]:
    """Highest self time first ("cpu" or "device"), ties by total time then name."""
    key = SORT_KEYS[sort_by]
    total = "cpu_total_us" if sort_by == "cpu" else "device_total_us"
    return sorted(rows, key=lambda r: (-(r[key] or 0.0), -(r[total] or 0.0), r["name"]))


def _us_cell(us: float | None) -> str:
    return format_us(us, na="-")


def _bytes_cell(n: int | None) -> str:
    return format_bytes(n, na="-")


def format_table(rows: list[dict[str, Any]], title: str = "", name_width: int = 60) -> str:
    """A fixed-width text table like torch's, with only the columns that were measured."""
    cols: list[tuple[str, str, Any]] = [("Self CPU", "self_cpu_us", _us_cell),
                                        ("CPU total", "cpu_total_us", _us_cell)]
    if any(r["self_device_us"] is not None for r in rows):
        cols += [("Self device", "self_device_us", _us_cell),
                 ("Device total", "device_total_us", _us_cell)]
    if any(r["cpu_memory_bytes"] is not None for r in rows):
        cols.append(("CPU mem", "cpu_memory_bytes", _bytes_cell))
    if any(r["device_memory_bytes"] is not None for r in rows):
        cols.append(("Device mem", "device_memory_bytes", _bytes_cell))
    header = f"{'Name':<{name_width}}" + "".join(f"{c[0]:>14}" for c in cols) + f"{'Calls':>9}"
    rule = "-" * len(header)
    lines = [title] if title else []
    lines += [rule, header, rule]
    for r in rows:
        name = r["name"] if len(r["name"]) <= name_width - 2 else r["name"][:name_width - 5] + "..."
        lines.append(f"{name:<{name_width}}" + "".join(f"{fmt(r[k]):>14}" for _, k, fmt in cols)
                     + f"{r['calls']:>9}")
    lines.append(rule)
    return "\n".join(lines) + "\n"


def analyse(trace_path: Path, out_dir: Path, sort_by: str = "cpu", top: int = 20,
            use_device: bool = False, profile_memory: bool = False,
            table_rows: int = 100) -> dict[str, Any]:
    """Trace -> top_ops.txt (table) and top_ops.json (the top rows); returns the JSON object."""
    t0 = time.perf_counter()
    trace = load_trace(trace_path)
    every = aggregate(trace, use_device, profile_memory)
    rows = rank_rows(every, sort_by)
    phases = phase_totals(every)
    n_events = sum(1 for e in trace.get("traceEvents", []) if e.get("ph") == "X")
    del trace
    total_self = sum(r["self_cpu_us"] for r in rows)
    title = (f"top ops of {trace_path.name}, sorted by self {sort_by} time; "
             f"{n_events} trace events, self CPU total {_us_cell(total_self)}")
    write_text(out_dir / "top_ops.txt", format_table(rows[:table_rows], title)
                  + format_phases(phases))
    result = {"sort_by": sort_by, "top_ops": rows[:top], "ops": len(rows), "events": n_events,
              "phases": phases, "analysis_s": time.perf_counter() - t0}
    write_text(out_dir / "top_ops.json", json.dumps(result, indent=1) + "\n")
    return result


def spawn_worker(trace_path: Path, out_dir: Path, sort_by: str, top: int, use_device: bool,
                 profile_memory: bool, log: IO[Any] | int) -> subprocess.Popen[bytes]:
    """Start :func:`analyse` in a fresh interpreter (no torch, no shared GIL), niced and detached
    from the terminal's Ctrl-C (a stopping run still collects its table).

    The worker starts idle and waits for a line on stdin: "go" analyses ``trace_path``, anything
    else (or EOF) exits. Starting a process costs the training ~50 ms of disturbed steps on two
    cores (and up to ~200 ms when it computes at once), so the window starts it early, during
    its wait/warmup steps, and only says "go" when the trace is written.
    """
    root = str(Path(__file__).resolve().parents[2])  # the folder holding probes/
    code = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
            "from probes.traces.opstable import main; sys.exit(main(sys.argv[1:]))")
    argv = [sys.executable, "-I", "-c", code, root, str(trace_path), str(out_dir),
            "--sort", sort_by, "--top", str(top), "--nice", "10", "--wait-for-go"]
    if use_device:
        argv.append("--device")
    if profile_memory:
        argv.append("--memory")
    argv += ["--parent", str(os.getpid())]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=log, close_fds=True, start_new_session=True)
    _WORKERS.add(proc)
    return proc


_WORKERS: weakref.WeakSet[subprocess.Popen[bytes]] = weakref.WeakSet()  # this process's


def kill_workers() -> int:
    """Kill every analysis worker this process started that is still running (a process that
    must leave now, from any thread); returns how many were killed."""
    killed = 0
    for proc in list(_WORKERS):
        if proc.returncode is None:
            with contextlib.suppress(OSError):
                proc.kill()
                killed += 1
    return killed


def _die_with_parent(parent: int) -> None:
    """Linux: be killed when the process that started us dies, however it dies (SIGKILL
    included); a table nobody will read must not keep a CPU busy."""
    with contextlib.suppress(Exception):
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m probes.traces.opstable",
                                     description="Top-ops table from a torch profiler trace.")
    parser.add_argument("trace", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--sort", choices=sorted(SORT_KEYS), default="cpu")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--device", action="store_true", help="the trace has device events")
    parser.add_argument("--memory", action="store_true", help="the trace has [memory] events")
    parser.add_argument("--nice", type=int, default=0, help="lower this process's priority")
    parser.add_argument("--wait-for-go", action="store_true",
                        help="wait for a line 'go' on stdin first; exit on anything else")
    parser.add_argument("--parent", type=int, default=None,
                        help="exit when this process (the one that started us) dies")
    args = parser.parse_args(argv)
    if args.parent is not None:
        _die_with_parent(args.parent)
    if args.nice:
        with contextlib.suppress(OSError):
            os.nice(args.nice)
    if args.wait_for_go and sys.stdin.readline().strip() != "go":
        return 0  # the window was cancelled
    analyse(args.trace, args.out_dir, args.sort, args.top, args.device, args.memory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
