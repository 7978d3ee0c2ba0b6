"""The profiler window on the real torch profiler: a real trainer thread, real files, no mocks
(`memtop train --headless --profile-at`: tests/integration/test_profiler_headless.py)."""

from __future__ import annotations

import json

import psutil
import torch
from factories import RecordSink, in_thread, resolved_amp

from probes.control.requests import RunControl
from probes.instruments.hooks import StepHook
from probes.instruments.profwindow import ProfilerWindow
from probes.runfolder import create_run_dir, read_metrics
from probes.traces.chrome_trace import aggregate, load_trace
from trainer.loop import Trainer

ROW_KEYS = {"name", "calls", "self_cpu_us", "cpu_total_us", "self_device_us", "device_total_us",
            "cpu_memory_bytes", "device_memory_bytes", "user_annotation",
            "on_device"}


class Watch(StepHook):
    """Presses `p` at chosen steps (from the training thread, through the real control object)
    and records whether torch's profiler is enabled as each step starts (Python flag and C++
    state) and the status line's phase as each step ends."""

    def __init__(self, control: RunControl, presses: dict[int, int] | None = None,
                 window: ProfilerWindow | None = None,
                 hold_analysis: tuple[int, int] | None = None) -> None:
        self.control = control
        self.hold_analysis = hold_analysis  # (freeze the worker after, resume after) steps
        self._held: list[psutil.Process] = []
        self.window = window
        self._asked = False  # a `p` sent that no boundary has taken yet
        self.presses = presses or {}
        self.enabled: dict[int, bool] = {}
        self.phase: dict[int, str | None] = {}
        self.trainer: Trainer | None = None

    def step_context(self, step):
        self._asked = False
        self.enabled[step] = (torch.autograd.profiler._is_profiler_enabled
                              or torch._C._autograd._profiler_enabled())
        return super().step_context(step)

    def end_step(self, step, tensors, sample):
        if self.trainer is not None:
            self.phase[step] = self.trainer.status.profile_phase
        if self.hold_analysis and step == self.hold_analysis[0]:  # a slow analysis, for sure
            self._held = [c for c in psutil.Process().children()
                          if "probes.traces.opstable" in " ".join(c.cmdline())]
            for child in self._held:
                child.suspend()
        if self.hold_analysis and step == self.hold_analysis[1]:
            for child in self._held:
                child.resume()
        for _ in range(self.presses.get(step, 0)):  # taken at the boundary before step + 1
            if self._asked or (self.window is not None and self.window.busy):
                self.control.cancel_profile()  # what `p` sends while a window is open
                self._asked = False
            else:
                self.control.request_profile()
                self._asked = True


def train(config, window: ProfilerWindow, presses: dict[int, int] | None = None,
          hold_analysis: tuple[int, int] | None = None):
    control = RunControl()
    watch = Watch(control, presses, window, hold_analysis)
    sink = RecordSink()
    run_dir = create_run_dir(config.run_dir)
    trainer = Trainer(config, run_dir, control=control, sinks=[sink], hooks=[window, watch])
    watch.trainer = trainer
    trainer.start()
    assert trainer.join(timeout=120), "trainer did not finish"
    assert trainer.exit_code == 0, sink.named("error")
    return run_dir, sink.events, {s.step: s for s in sink.samples}, watch


def named(events, name):
    return [e for e in events if e.event == name]


def test_window_table_agrees_with_key_averages(tiny_config):
    window = ProfilerWindow(1, 1, 3, at_steps=[3], profile_memory=True, record_shapes=True,
                            keep_profiler=True)
    # the worker (idle until the trace is written at step 7) is frozen from step 6 to 13, so
    # the table is still being analysed at steps 8-13 however fast this machine is
    run_dir, events, samples, watch = train(tiny_config(steps=14), window, hold_analysis=(6, 13))

    started, done = named(events, "profile_started"), named(events, "profile_done")
    assert len(started) == 1 and len(done) == 1 and not named(events, "profile_cancelled")
    assert started[0].step == 3
    assert {"wait": 1, "warmup": 1, "active": 3, "record_shapes": True,
            "profile_memory": True}.items() <= started[0].data.items()
    data = done[0].data
    assert data["dir"] == "profiles/step-3" and data["sort_by"] == "cpu"
    assert data["trace"] == "trace.json" and data["analysis_s"] > 0
    assert data["steps"] == [5, 6, 7]
    assert data["in_process"] is False  # the table came from the child process, not the GIL
    top = data["top_ops"]
    assert 10 <= len(top) <= 20 and all(set(r) == ROW_KEYS for r in top)
    assert top == sorted(top, key=lambda r: -r["self_cpu_us"])
    assert all(r["self_device_us"] is None and r["cpu_memory_bytes"] is not None for r in top)

    # torch's own key_averages() over the very same profiler run (on a non-main thread).
    averages = in_thread(lambda: {e.key: e for e in window.last_profiler.key_averages()})
    theirs = sorted(averages.values(), key=lambda e: -e.self_cpu_time_total)
    assert {r["name"] for r in top[:8]} == {e.key for e in theirs[:8]}
    for row in top:
        ref = averages[row["name"]]
        assert row["calls"] == ref.count, row["name"]
        assert abs(row["self_cpu_us"] - ref.self_cpu_time_total) <= max(
            1.0, 0.01 * ref.self_cpu_time_total), row["name"]
        assert abs(row["cpu_total_us"] - ref.cpu_time_total) <= max(
            1.0, 0.01 * ref.cpu_time_total), row["name"]
        assert row["cpu_memory_bytes"] == ref.cpu_memory_usage, row["name"]
    assert "aten::mm" in {r["name"] for r in top}
    # every row, not only the top ones: same ops, same call counts, same times and memory
    # the columns come from the trace itself (a CPU run's trace, whatever GPU this machine has)
    rows = aggregate(load_trace(run_dir / "profiles/step-3/trace.json"))
    assert all(r["self_device_us"] is None and r["cpu_memory_bytes"] is not None for r in rows)
    assert sorted(r["name"] for r in rows) == sorted(averages)
    for row in rows:
        ref = averages[row["name"]]
        assert (row["calls"], row["cpu_memory_bytes"]) == (ref.count, ref.cpu_memory_usage)
        assert row["user_annotation"] == bool(ref.is_user_annotation), row["name"]
        assert abs(row["self_cpu_us"] - ref.self_cpu_time_total) <= 1.0, row["name"]
    assert averages["ProfilerStep*"].count == 3  # exactly the active steps were recorded

    # the phases counted on the status line, and the profiler only ran inside the window
    assert [watch.phase[s] for s in range(3, 7)] == [
        "warmup 1/1", "active 1/3", "active 2/3", "active 3/3"]
    assert [watch.phase[s] for s in range(7, 14)] == ["analysing"] * 7
    assert not any(watch.enabled[s] for s in (1, 2, 3, 4))
    assert all(watch.enabled[s] for s in (5, 6))
    assert not any(watch.enabled[s] for s in range(8, 15))
    # `profiling` marks exactly the traced steps, not the analysis the status line shows
    assert [s for s in range(1, 15) if samples[s].profiling] == [3, 4, 5, 6, 7]

    folder = run_dir / "profiles" / "step-3"
    trace = load_trace(folder / "trace.json")
    assert len(trace["traceEvents"]) > 1000
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"forward", "backward", "optimizer"} <= names
    info = json.loads((folder / "window.json").read_text())
    assert info["schedule"] == {"wait": 1, "warmup": 1, "active": 3, "repeat": 1}
    assert info["steps"] == {"wait": [3], "warmup": [4], "active": [5, 6, 7]}
    assert (info["batch_size"], info["seq_len"], info["amp"], info["device"]) == (
        4, 16, resolved_amp(run_dir), "cpu")
    assert info["torch_version"] == torch.__version__ and info["profile_memory"] is True
    table = (folder / "top_ops.txt").read_text()
    assert "aten::mm" in table and "Self CPU" in table and "CPU mem" in table
    assert not list(folder.glob("*.tmp"))
    _, rows, _ = read_metrics(run_dir / "metrics.jsonl")
    assert [r["event"] for r in rows if r["event"].startswith("profile_")] == [
        "profile_started", "profile_analysing", "profile_done"]


def test_cancel_and_quick_presses(tiny_config):
    # 2: open at 3 | 5: cancel during active 1/3 at 6 | 7: two presses: open + cancel at 8
    # 9: open at 10, window 10..14 | 14 (last active step): press during analysis or right after
    window = ProfilerWindow(1, 1, 3)
    presses = {2: 1, 5: 1, 7: 2, 9: 1, 14: 1}
    run_dir, events, samples, watch = train(tiny_config(steps=20), window, presses)

    seq = [(e.event, e.step) for e in events
           if e.event.startswith("profile_") and e.event != "profile_analysing"]
    assert seq[:5] == [("profile_started", 3), ("profile_cancelled", 6), ("profile_started", 8),
                       ("profile_cancelled", 8), ("profile_started", 10)]
    assert named(events, "profile_cancelled")[0].data["reason"] == "cancelled by user"
    assert not (run_dir / "profiles" / "step-3").exists()  # nothing half-written
    assert not (run_dir / "profiles" / "step-8").exists()
    assert watch.enabled[5] and not watch.enabled[6] and not watch.enabled[7]
    assert watch.phase[6] is None and not samples[6].profiling
    # the last press lands while the window at 10 is analysed (usually: it is cancelled, the
    # worker killed) or just after (a new window opens at 15): every window ends exactly once
    ends = [e for e in events if e.event in ("profile_done", "profile_cancelled")]
    assert len(ends) == len(named(events, "profile_started"))
    assert watch.enabled[12] and not watch.enabled[15] and not watch.enabled[16]
    folder = run_dir / "profiles" / "step-10"
    assert json.loads((folder / "trace.json").read_text())["traceEvents"]
    if seq[5] == ("profile_cancelled", 15):
        assert "during analysis" in ends[-1].data["reason"]
        assert not (folder / "top_ops.json").exists() and not list(folder.glob("*.tmp"))
    else:
        assert seq[5][0] == "profile_done"
    assert not window.busy
    # the idle workers started for the cancelled windows were told to exit and were reaped
    workers = [p for p in psutil.Process().children(recursive=True)
               if "probes.traces.opstable" in " ".join(p.cmdline())]
    assert workers == []


def test_device_kernels_count_towards_the_op_that_launched_them():
    """CUDA traces cannot be made here: a hand-written one, read by torch 2.13's rules."""
    def x(name, cat, ts, dur, ext, tid=1, pid=1):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts,
                "dur": dur, "args": {"External id": ext}}

    trace = {"traceEvents": [
        x("forward", "user_annotation", 100.0, 100.0, 1),
        x("aten::linear", "cpu_op", 110.0, 50.0, 2),
        x("aten::mm", "cpu_op", 120.0, 30.0, 3),
        x("aten::mm", "cpu_op", 121.0, 20.0, 4),  # lone same-name child: folded into its parent
        x("cudaLaunchKernel", "cuda_runtime", 125.0, 5.0, 4),
        x("gemm_kernel", "kernel", 200.0, 40.5, 4, tid=7, pid=0),
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1,
         "ts": 126.0, "args": {"Bytes": 4096, "Device Type": 1}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1,
         "ts": 500.0, "args": {"Bytes": 64, "Device Type": 0}},
    ]}
    rows = {r["name"]: r for r in aggregate(trace, use_device=True, profile_memory=True)}
    mm = rows["aten::mm"]
    assert mm["calls"] == 1 and mm["cpu_total_us"] == 30.0 and mm["self_cpu_us"] == 25.0
    assert mm["self_device_us"] == 40.5 and mm["device_total_us"] == 40.5
    assert mm["device_memory_bytes"] == 4096 and mm["cpu_memory_bytes"] == 0
    assert rows["aten::linear"]["self_device_us"] == 0.0
    assert rows["aten::linear"]["device_total_us"] == 40.5
    assert rows["forward"]["self_cpu_us"] == 50.0 and rows["forward"]["device_total_us"] == 40.5
    kernel = rows["gemm_kernel"]
    assert (kernel["calls"], kernel["self_cpu_us"], kernel["self_device_us"]) == (1, 0.0, 40.5)
    assert rows["cudaLaunchKernel"]["self_cpu_us"] == 5.0
    assert rows["[memory]"]["calls"] == 1 and rows["[memory]"]["cpu_memory_bytes"] == 64


def test_a_finished_window_hands_the_freed_heap_back(tiny_config):
    """issue 28: after the export the profiler is freed (it lives in reference cycles: a
    collection, not a del) and then malloc_trim(0) runs on glibc (None where there is none); a
    profiler kept for the caller keeps its buffers, so nothing is trimmed then."""
    import gc
    import weakref

    from probes.counters.memory import trim_heap

    class Watched(ProfilerWindow):
        def _open(self, step: int, trigger: str) -> None:
            super()._open(step, trigger)
            self.profiler_ref = weakref.ref(self._window.prof)

    window = Watched(0, 1, 1, at_steps=[2])
    gc.disable()  # only the window's own collection may free its profiler's cycle
    try:
        train(tiny_config(steps=6), window)
        assert window.profiler_ref() is None  # freed before the trim, not at some later gc
    finally:
        gc.enable()
    expected = (None,) if trim_heap() is None else (True, False)
    assert len(window.trimmed) == 1 and window.trimmed[0] in expected
    kept = ProfilerWindow(0, 1, 1, at_steps=[2], keep_profiler=True)
    train(tiny_config(steps=6), kept)
    assert kept.trimmed == []
