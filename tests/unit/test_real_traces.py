"""The top-ops table on real GPU traces recorded by others on A100s and V100s (Kineto of several
vintages; tests/data/README.md and ../shared/gpu-artifacts/README.md say what each is).

Each trace is checked against a small computation over its JSON written here, independent of
probes/traces/chrome_trace.py: a device event (kernel, memcpy, memset) was launched by the CPU op
whose "External id" it carries when that differs from its correlation (newer Kineto), else by
the innermost cpu_op / user_annotation that encloses, on the same thread, the cuda_runtime call
with its correlation (older Kineto). Times are read as exact decimals.
"""

from __future__ import annotations

import bisect
import gzip
import json
import subprocess
import sys
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import pytest
from factories import DATA, ROOT, shared_gpu_artifact, subprocess_env

from probes.traces.chrome_trace import load_trace, read_ops

# device time (kernel + memcpy + memset, µs) as ../shared/gpu-artifacts/README.md states it
TRACES = {
    "a100-alexnet-trace.json.gz": 66_203,
    "v100-resnet-train-trace.json.gz": 472_454,
    "a100-80gb-compiled-rank0-trace.json.gz": 449_763,
    "v100-memory-events-trace.json.gz": 1_000_613,
}
SMALL = "a100-alexnet-trace.json.gz"  # copied into tests/data; the others are read in place
WORK = ("kernel", "gpu_memcpy", "gpu_memset")
pytestmark = pytest.mark.xdist_group("real_traces")  # one worker reads each trace once


def trace_path(name: str) -> Path:
    if (DATA / name).is_file():
        return DATA / name
    path = shared_gpu_artifact(name)
    if path is None:
        pytest.skip(f"{name}: no ../shared/gpu-artifacts beside this checkout")
    return path


def independent(path: Path) -> dict:
    """Per launching op name, the device µs it launched; the trace's device µs; what no op
    launched (µs, events, and how many of those came before the first runtime call)."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        events = [e for e in json.load(fh, parse_float=Decimal)["traceEvents"]
                  if e.get("ph") == "X"]
    ops = sorted((e for e in events if e.get("cat") in ("cpu_op", "user_annotation")),
                 key=lambda e: (e["ts"], -e["dur"], e["args"]["External id"]))
    by_ext = {e["args"]["External id"]: e for e in ops}
    by_thread: dict = defaultdict(list)
    for op in ops:
        by_thread[(op["pid"], op["tid"])].append(op)
    starts = {k: [op["ts"] for op in v] for k, v in by_thread.items()}
    calls = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
    first_call = min(calls) if calls else 0

    def enclosing(call: dict) -> dict | None:
        key = (call["pid"], call["tid"])
        thread = by_thread.get(key, [])
        i = bisect.bisect_right(starts.get(key, []), call["ts"]) - 1
        while i >= 0:  # the latest-starting op that still covers the call is the innermost
            if thread[i]["ts"] + thread[i]["dur"] >= call["ts"] + call["dur"]:
                return thread[i]
            i -= 1
        return None

    launched: dict[str, Decimal] = defaultdict(Decimal)
    total = lost = Decimal(0)
    lost_events = lost_before_first_call = 0
    for e in events:
        if e.get("cat") not in WORK:
            continue
        total += e["dur"]
        ext, corr = e["args"].get("External id"), e["args"].get("correlation")
        op = by_ext.get(ext) if ext != corr else None
        if op is None and corr in calls:
            op = enclosing(calls[corr])
        if op is None:
            lost += e["dur"]
            lost_events += 1
            lost_before_first_call += corr < first_call
            continue
        name = "ProfilerStep*" if op["name"].startswith("ProfilerStep#") else op["name"]
        launched[name] += e["dur"]
    return {"launched": launched, "total": total, "lost": lost, "lost_events": lost_events,
            "lost_before_first_call": lost_before_first_call}


_CACHE: dict[str, tuple] = {}


def both(name: str) -> tuple:
    """(memtop's read, the independent computation) of one trace, computed once per worker."""
    if name not in _CACHE:
        path = trace_path(name)
        _CACHE[name] = (read_ops(load_trace(path)), independent(path))
    return _CACHE[name]


def _params():
    for name in TRACES:
        marks = [] if name == SMALL else [pytest.mark.slow]  # 1-3 MB of gzipped JSON each
        yield pytest.param(name, marks=marks, id=name.split("-trace")[0])


@pytest.mark.parametrize("name", _params())
def test_device_time_reconciles_on_real_traces(name):
    ops, ref = both(name)
    assert round(ref["total"]) == TRACES[name]  # the README's figure, from the JSON
    dev = ops.device
    assert dev is not None  # found from the trace: no flag
    assert dev.total_us == pytest.approx(float(ref["total"]), abs=1e-3)
    assert dev.launched_us + dev.unattributed_us == pytest.approx(dev.total_us, abs=1e-6)
    assert dev.unattributed_us == pytest.approx(float(ref["lost"]), abs=1e-3)
    assert dev.unattributed_events == ref["lost_events"]
    cpu_rows = [r for r in ops.rows if not r["on_device"]]
    assert sum(r["self_device_us"] for r in cpu_rows) == pytest.approx(dev.launched_us, abs=1e-3)
    # every kernel / memcpy / memset keeps its own row, as in torch's table
    work = sum(r["self_device_us"] for r in ops.rows
               if r["on_device"] and not r["user_annotation"])
    assert work == pytest.approx(dev.total_us, abs=1e-3)
    assert ops.gpu and ("A100" in ops.gpu or "V100" in ops.gpu)


@pytest.mark.parametrize("name", _params())
def test_top_launching_ops_match_an_independent_count(name):
    ops, ref = both(name)
    theirs = sorted(ref["launched"].items(), key=lambda kv: -kv[1])[:8]
    rows = {r["name"]: r for r in ops.rows if not r["on_device"]}
    ours = sorted(rows.values(), key=lambda r: -r["self_device_us"])[:8]
    assert [r["name"] for r in ours[:5]] == [n for n, _ in theirs[:5]]
    for op, us in theirs:
        assert rows[op]["self_device_us"] == pytest.approx(float(us), abs=1e-3), op
    assert all(v > 0 for _, v in theirs)  # device time reaches the ops on every vintage


def test_alexnet_copies_go_to_the_copy_op():
    """Older Kineto (correlation only): the 16 host-to-device copies were credited to
    aten::to / empty_strided / view through colliding ids before the runtime call was followed."""
    ops, _ = both(SMALL)
    rows = {(r["name"], r["on_device"]): r for r in ops.rows}
    copies = rows[("Memcpy HtoD (Pageable -> Device)", True)]
    assert copies["calls"] == 16
    assert rows[("aten::copy_", False)]["self_device_us"] == copies["self_device_us"] == 55_503
    for op in ("aten::to", "aten::empty_strided", "aten::view"):
        assert not rows.get((op, False), {}).get("self_device_us")
    assert ops.device.linked_by_correlation == 98 and ops.device.unattributed_events == 0


@pytest.mark.slow  # 1.4 MB of gzipped JSON
def test_kernels_queued_before_the_window_are_counted_not_guessed():
    ops, ref = both("a100-80gb-compiled-rank0-trace.json.gz")
    # their launches happened before the trace's first runtime call: no op can be named
    assert ref["lost_events"] == ref["lost_before_first_call"] == ops.device.unattributed_events
    assert 0 < ops.device.unattributed_us < 0.2 * ops.device.total_us


def test_the_command_line_finds_the_device_columns_itself(tmp_path):
    res = subprocess.run([sys.executable, "-m", "probes.traces.opstable",
                          str(trace_path(SMALL)), str(tmp_path)], capture_output=True,
                         text=True, timeout=60, cwd=ROOT, env=subprocess_env())
    assert res.returncode == 0, res.stderr
    table = (tmp_path / "top_ops.txt").read_text()
    title, header = table.splitlines()[0], table.splitlines()[2]
    assert "sorted by self device time" in title and "A100" in title
    assert "Self device" in header and "Device total" in header
    assert "66.203 ms" in table and "0.000 ms no op launched" in table
    result = json.loads((tmp_path / "top_ops.json").read_text())
    top = [r["name"] for r in result["top_ops"][:2]]
    assert "aten::copy_" in top and result["device_time"]["total_us"] == 66_203


def test_a_device_sort_without_device_events_says_so(tmp_path):
    from probes.traces.opstable import analyse

    trace = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10,
         "dur": 30, "args": {"External id": 1}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 50,
         "dur": 5, "args": {"External id": 2}}]}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    result = analyse(path, tmp_path, sort_by="device")
    assert result["sort_by"] == "cpu" and result["device_time"] is None
    assert [r["name"] for r in result["top_ops"]] == ["aten::mm", "aten::add"]
    text = (tmp_path / "top_ops.txt").read_text()
    assert "sorted by self cpu time (no device events in this trace)" in text
    assert "Self device" not in text
