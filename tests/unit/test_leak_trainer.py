"""Real leaks in the real trainer: caught and cleared in time, a healthy run with pauses and
profiler windows quiet, the demo toggled through the control object, device and host heap as
two series on CUDA, and headless lines for the alert and the clear."""

from __future__ import annotations

import io
import json
import time

import pytest
from factories import RecordSink, make_sample, run_context, wait_until

from probes.control.requests import RunControl
from probes.instruments.leakwatch import LeakWatch
from probes.records import Event
from probes.runfolder import create_run_dir, read_metrics
from probes.tools.kvcache import DTYPE_BYTES
from trainer.loop import Trainer

KIB, MIB = 1024, 1024 * 1024


# the real trainer --------------------------------------------------------------------------------
# Leaks of the default run's size on models that step in a few ms: the autograd graph of four
# layers is ~130 KiB/step (fp32) to ~152 KiB/step (bf16) whatever the width; B=16, T=128 logits
# are 1 MiB/step in bf16, 2 MiB in fp32. The graph case's logits (B=16, T=32: 256 or 512 KiB) are
# larger than the graph, as the default run's are: with B=4, T=16 fp32 logits (64 KiB) the graph
# grew by two of them a step, and a guess from sizes alone took it for kept tensors.
GRAPH_SIZED = dict(layers=4, batch_size=16, seq_len=32, warmup_steps=5)
LOGITS_SIZED = dict(batch_size=16, seq_len=128, block_size=128, warmup_steps=5)


def train(config, hooks, control: RunControl | None = None):
    sink = RecordSink()
    trainer = Trainer(config, create_run_dir(config.run_dir), control=control, sinks=[sink],
                      hooks=hooks)
    trainer.start()
    return trainer, sink


@pytest.mark.parametrize("kind,sized,within", [("graph", GRAPH_SIZED, 10),
                                               ("logits", LOGITS_SIZED, 5)])
def test_real_leak_is_caught_and_cleared_in_time(tiny_config, kind, sized, within):
    cfg = tiny_config(leak=kind, leak_at=20, leak_stop_at=40, steps=62, **sized)
    watch = LeakWatch()
    trainer, sink = train(cfg, [watch])
    assert trainer.join(300) and trainer.exit_code == 0  # generous: the CPU is shared
    (alert,) = sink.named("leak_suspected")
    (cleared,) = sink.named("leak_cleared")
    assert 20 < alert.step <= 20 + within
    data = alert.data
    assert data["counter"] == "host_heap" and data["since_step"] == 21
    assert data["likely_cause"] == ("graph" if kind == "graph" else "tensors")
    assert "likely" in data["hint"]
    amp = json.loads((trainer.run_dir / "config.json").read_text())["resolved_amp"]
    logits = cfg.batch_size * cfg.seq_len * 256 * DTYPE_BYTES[amp]  # this run's own dtype
    expected = (130 if amp == "off" else 152) * KIB if kind == "graph" else logits
    assert data["bytes_per_step"] == pytest.approx(expected, rel=0.2)
    assert data["capacity_bytes"] > 0 and data["steps_to_full"] > 1000
    assert data["seconds_to_full"] > 0 and data["window_steps"] >= 4
    assert 40 <= cleared.step <= 40 + 20 and cleared.data["since_step"] == 40
    _, events, bad = read_metrics(trainer.run_dir / "metrics.jsonl")
    names = [e["event"] for e in events]
    assert bad == 0 and names.index("leak_suspected") < names.index("leak_cleared")


@pytest.mark.slow
def test_healthy_run_with_pause_and_profiler_windows_stays_quiet(tiny_config):
    from probes.instruments.profwindow import ProfilerWindow

    cfg = tiny_config(steps=150, **GRAPH_SIZED)
    watch = LeakWatch()
    window = ProfilerWindow(1, 1, 3, at_steps=[40, 100], analysis="inprocess")
    control = RunControl()
    trainer, sink = train(cfg, [window, watch], control=control)
    wait_until(lambda: trainer.status.step >= 70, "step 70", timeout_s=300)
    control.pause()
    wait_until(lambda: trainer.status.state == "paused", "the pause", timeout_s=300)
    held = [bytearray(MIB) for _ in range(16)]  # the UI thread allocates while training waits
    # a pause of at least 1.5 s, longer than the detector's pause_gap_s (1 s): a lower bound,
    # true on any machine, so the gap across it is always recognised as a pause
    paused = time.monotonic()
    wait_until(lambda: time.monotonic() - paused >= 1.5, "a 1.5 s pause")
    control.resume()
    assert trainer.join(300) and trainer.exit_code == 0
    assert len(sink.samples) == 150 and held
    assert sink.named("leak_suspected") == [] and sink.named("leak_cleared") == []
    assert watch.pauses_seen >= 1  # a >1 s stall on a loaded machine reads as another
    assert len(sink.named("profile_done")) == 2
    profiled = sum(s.profiling for s in sink.samples)
    assert watch.ignored_steps >= 5 + profiled + 2 * watch.settle_steps


def test_leak_demo_toggled_through_the_control_object(tiny_config):
    cfg = tiny_config(steps=0, **GRAPH_SIZED)
    control = RunControl()
    trainer, sink = train(cfg, [LeakWatch()], control=control)

    try:
        wait_until(lambda: trainer.status.step >= 20, "step 20", timeout_s=300)
        control.start_leak()  # `l`: start the graph leak
        wait_until(lambda: sink.named("leak_suspected"), "the alert", timeout_s=300)
        assert trainer.status.leak_active
        control.stop_leak()  # `l` again: stop it and drop what it kept
        wait_until(lambda: sink.named("leak_cleared"), "the all-clear", timeout_s=300)
    finally:
        control.stop()
        trainer.join(300)
    (started,) = sink.named("leak_demo_started")
    (stopped,) = sink.named("leak_demo_stopped")
    (alert,) = sink.named("leak_suspected")
    (cleared,) = sink.named("leak_cleared")
    assert started.step < alert.step <= started.step + 10
    assert alert.data["since_step"] == started.step + 1
    assert stopped.step <= cleared.step <= stopped.step + 20
    assert not trainer.status.leak_active


def test_on_cuda_device_and_host_heap_are_two_series(tmp_path):
    """No GPU here: the records a CUDA run would produce, read with the real host heap."""
    import torch

    from probes.instruments.hooks import StepTensors

    events: list[Event] = []
    total = 80 * 1024 * MIB
    watch = LeakWatch()
    watch.setup(run_context(tmp_path, device=torch.device("cuda", 0), amp="fp16",
                            emit=events.append, device_total_bytes=total))
    assert set(watch.detectors) == {"device_allocated", "host_heap"}
    # logits of a B=16, T=128 fp16 run, on the meta device: sizes without memory or compute
    logits = torch.empty(16, 128, 256, dtype=torch.float16, device="meta")
    tensors = StepTensors(loss=torch.empty((), device="meta"), output=logits)
    for step in range(1, 41):
        allocated = 2 * 1024 * MIB + (1 * MIB * (step - 20) if step > 20 else 0)
        sample = make_sample(
            step, step_ms=90.0, allocated_bytes=allocated, reserved_bytes=allocated + 64 * MIB,
            peak_allocated_bytes=allocated, driver_used_bytes=allocated + 600 * MIB,
            host_rss_bytes=3 * 1024 * MIB, scale=65536.0, amp="fp16", device="cuda:0")
        watch.end_step(step, tensors, sample)
    (alert,) = [e for e in events if e.event == "leak_suspected"]
    data = alert.data
    assert data["counter"] == "device_allocated" and data["since_step"] == 21
    assert alert.step == 24 and data["bytes_per_step"] == 1 * MIB
    assert data["likely_cause"] == "tensors" and "1.0 MiB" in data["hint"]
    used = 2 * 1024 * MIB + 4 * MIB + 600 * MIB  # NVML's figure for the process at step 24
    assert data["capacity_bytes"] == total - used
    assert data["steps_to_full"] == (total - used) // MIB
    assert data["seconds_to_full"] == pytest.approx(data["steps_to_full"] * 0.1, rel=0.01)


@pytest.mark.parametrize("leak", [True, False])
def test_headless_prints_the_alert_and_the_clear(tiny_config, leak):
    from tui.headless import run_headless

    extra = dict(leak_at=15, leak_stop_at=35) if leak else {}
    cfg = tiny_config(steps=50, **GRAPH_SIZED, **extra)
    out = io.StringIO()
    assert run_headless(cfg, create_run_dir(cfg.run_dir), log_every=100, out=out) == 0
    text = out.getvalue()
    assert ("== leak_suspected at step" in text) is leak
    assert ("== leak_cleared at step" in text) is leak
    if leak:
        assert "host_heap grows" in text and "loss.item()" in text


def test_on_cuda_the_host_heap_is_watched_at_the_probes_budgeted_rate(tmp_path):
    """issue 45: a CUDA run watches the host heap too, from the reading the memory probe took
    at the step's end (its budgeted rate: probes/counters/memory.py); the steps it skipped are
    neither points nor gaps, and a graph leak's ~150 KiB/step of heap read every step alerts
    within 10 steps of its start, device memory flat."""
    import torch

    from probes.instruments.hooks import StepTensors

    events: list[Event] = []
    watch = LeakWatch()
    watch.setup(run_context(tmp_path, device=torch.device("cuda", 0), amp="fp16",
                            emit=events.append, device_total_bytes=80 * 1024 * MIB,
                            warmup_steps=0))
    assert set(watch.detectors) == {"device_allocated", "host_heap"}
    for step in range(1, 46):
        heap = 300 * MIB + (step % 3) * 1024 if step % 4 == 0 else None  # every 4th step read
        watch.end_step(step, StepTensors(loss=None, output=None, host_heap_bytes=heap),
                       make_sample(step, step_ms=5.0, allocated_bytes=MIB, device="cuda:0",
                                   time_s=0.005 * step))
    host, device = watch.detectors["host_heap"], watch.detectors["device_allocated"]
    assert device._seen == 45
    assert host._seen == 11 and [s for s, _v in host._points][:3] == [4, 8, 12]
    assert not events

    events.clear()
    watch = LeakWatch()
    watch.setup(run_context(tmp_path, device=torch.device("cuda", 0), amp="fp16",
                            emit=events.append, device_total_bytes=80 * 1024 * MIB,
                            warmup_steps=0))
    leak_from = 30
    for step in range(1, 60):
        heap = 300 * MIB + (step % 3) * 2048 + max(0, step - leak_from) * 150 * 1024
        watch.end_step(step, StepTensors(loss=None, output=None, host_heap_bytes=heap),
                       make_sample(step, step_ms=5.0, allocated_bytes=MIB + 512 * (step % 2),
                                   device="cuda:0", time_s=0.005 * step))
    alerts = [e for e in events if e.event == "leak_suspected"]
    assert alerts and alerts[0].data["counter"] == "host_heap"
    assert alerts[0].step - leak_from <= 10


def test_on_cpu_rows_that_repeat_a_spread_heap_read_are_no_points(tmp_path):
    """A fragmented heap's read spread over steps (probes/counters/memory.py): the rows that
    repeat an earlier reading are neither points nor gaps, so the leak still shows its rate."""
    from probes.instruments.hooks import StepTensors

    events: list[Event] = []
    watch = LeakWatch()
    watch.setup(run_context(tmp_path, emit=events.append, warmup_steps=0))
    heap = 0
    for step in range(1, 200):
        fresh = step % 8 == 0
        if fresh:
            heap = 100 * MIB + step * 200 * 1024  # 200 KiB a step, seen every 8th step
        watch.end_step(step, StepTensors(loss=None, output=None, heap_fresh=fresh),
                       make_sample(step, step_ms=5.0, allocated_bytes=heap or 100 * MIB,
                                   host_rss_bytes=400 * MIB, time_s=0.005 * step))
    (detector,) = watch.detectors.values()
    assert [s for s, _v in detector._points][-3:] == [176, 184, 192]
    alert = next(e for e in events if e.event == "leak_suspected")
    assert alert.data["bytes_per_step"] == pytest.approx(200 * 1024, rel=0.05)
