"""The leak detector: synthetic series first, then real leaks in the real trainer."""

from __future__ import annotations

import io
import json
import random
import time

import pytest
from factories import RecordSink, make_sample, run_context, wait_until

from probes.control.requests import RunControl
from probes.instruments.leak import (
    LeakAlert,
    LeakCleared,
    LeakDetector,
    LeakDetectorConfig,
    theil_sen_slope,
)
from probes.instruments.leakwatch import LeakWatch, likely_cause
from probes.records import Event
from probes.runfolder import create_run_dir, read_metrics
from probes.tools.kvcache import DTYPE_BYTES
from trainer.loop import Trainer

KIB, MIB = 1024, 1024 * 1024
BASE = 140 * MIB  # about the default run's heap in use


def feed(values, detector: LeakDetector | None = None, start: int = 1):
    """Feed a whole series; returns the detector and the (step, result) of every alert/clear."""
    detector = detector or LeakDetector("host_heap")
    out = []
    for i, value in enumerate(values):
        result = detector.feed(start + i, int(value))
        if result is not None:
            out.append((start + i, result))
    return detector, out


def noise(rng: random.Random, n: int, sigma: float = 2 * KIB, spikes: float = 0.01):
    """Flat heap with the noise measured on this machine, plus rare one-step spikes (gc, UI)."""
    return [BASE + rng.gauss(0, sigma) + (rng.choice((-1, 1)) * 300 * KIB
                                           if rng.random() < spikes else 0) for _ in range(n)]


def alerts(results):
    return [(s, r) for s, r in results if isinstance(r, LeakAlert)]


# the pure detector -------------------------------------------------------------------------------
def test_theil_sen_ignores_one_outlier():
    xs = list(range(10))
    ys = [3.0 * x for x in xs]
    ys[4] += 1000
    assert theil_sen_slope(xs, ys) == pytest.approx(3.0)


@pytest.mark.parametrize("seed", range(4))
def test_flat_noise_never_alerts(seed):
    detector, results = feed(noise(random.Random(seed), 3000))
    assert results == []
    assert 1 * KIB < detector.noise_bytes < 6 * KIB  # learned: sqrt(2) * 2 KiB for one delta


@pytest.mark.parametrize("bump", [0, 6 * KIB, 10 * KIB, 14 * KIB])
def test_since_is_the_first_step_of_the_leak_whatever_came_just_before(bump):
    """`--leak-at 30` said "since 30" in one run and "since 31" in another (issue 38): one
    small allocation or a step of noise just before a 150 KiB/step leak passed half the
    threshold and moved "since" a step earlier. Since is where the leak's own growth starts."""
    rng = random.Random(3)
    values = noise(rng, 60, 1 * KIB, spikes=0)
    values[-1] += bump  # step 60: a one-off allocation that stays, or noise
    values += [values[-1] + 150 * KIB * (i + 1) + rng.gauss(0, KIB) for i in range(30)]
    _, results = feed(values)
    (step, alert), = results
    assert isinstance(alert, LeakAlert) and alert.since_step == 61, (bump, alert.since_step)


@pytest.mark.parametrize("rate,sigma", [(32 * KIB, 2 * KIB), (152 * KIB, 2 * KIB),
                                        (64 * KIB, 8 * KIB)])
def test_slow_ramp_alerts_with_its_rate_and_start(rate, sigma):
    rng = random.Random(7)
    values = noise(rng, 60, sigma, spikes=0) + [
        BASE + rate * (i + 1) + rng.gauss(0, sigma) for i in range(80)]
    _, results = feed(values)
    (step, alert), = results  # one alert, never cleared while it grows
    assert isinstance(alert, LeakAlert)
    assert alert.since_step == 61
    needed = -(-LeakDetectorConfig().min_growth_bytes // rate)  # ceil: steps to 512 KiB
    assert step <= 61 + needed + 2
    assert alert.bytes_per_step == pytest.approx(rate, rel=0.15)
    assert alert.window_steps >= 4


def test_growth_below_the_floor_is_not_reported():
    # ~1 KiB/step is what a UI history ring costs while it fills: not a leak worth a banner
    rng = random.Random(3)
    _, results = feed([BASE + 1 * KIB * i + rng.gauss(0, 300) for i in range(600)])
    assert results == []


@pytest.mark.parametrize("shape", ["one jump", "jump over two steps", "staircase",
                                   "short small rises"])
def test_one_off_step_changes_do_not_alert(shape):
    rng = random.Random(11)
    values = noise(rng, 300, spikes=0)
    if shape == "one jump":
        values = [v + (64 * MIB if i >= 100 else 0) for i, v in enumerate(values)]
    elif shape == "jump over two steps":
        values = [v + (8 * MIB if i >= 100 else 0) + (8 * MIB if i >= 101 else 0)
                  for i, v in enumerate(values)]
    elif shape == "staircase":  # a cache growing once in a while, as when a new shape shows up
        values = [v + (i // 20) * 4 * MIB for i, v in enumerate(values)]
    else:  # every 40 steps a buffer grows 24 KiB/step for 5 steps, then stays: 120 KiB in all
        values = [v + 120 * KIB * (i // 40) + 24 * KIB * min(5, i % 40)
                  for i, v in enumerate(values)]
    assert feed(values)[1] == []


@pytest.mark.parametrize("period,rise", [(2, 4 * MIB), (3, 1 * MIB), (5, 256 * KIB),
                                         (7, 2 * MIB), (6, 64 * KIB)])
def test_caching_sawtooth_does_not_alert(period, rise):
    rng = random.Random(period)
    values = [BASE + (i % period) * rise + rng.gauss(0, 2 * KIB) for i in range(600)]
    assert feed(values)[1] == []


def test_long_sawtooth_alerts_at_most_on_its_first_tooth():
    # 23 steps of growth then a release: the first tooth is a leak for that long (documented);
    # every later tooth only refills a level already reached.
    rng = random.Random(5)
    flat = noise(rng, 30, spikes=0)
    teeth = [BASE + (i % 24) * 100 * KIB + rng.gauss(0, 2 * KIB) for i in range(24 * 10)]
    _, results = feed(flat + teeth)
    assert len(alerts(results)) <= 1
    assert all(step <= 30 + 24 for step, _ in results)


def test_clears_after_the_fix_releases_memory():
    rng = random.Random(1)
    values = (noise(rng, 30, spikes=0) + [BASE + 152 * KIB * (i + 1) for i in range(50)]
              + noise(rng, 40, spikes=0))
    _, results = feed(values)
    (a_step, alert), (c_step, cleared) = results
    assert isinstance(alert, LeakAlert) and a_step <= 31 + 10 and alert.since_step == 31
    assert isinstance(cleared, LeakCleared) and cleared.since_step == 81
    assert c_step <= 81 + LeakDetectorConfig().clear_steps
    assert cleared.alert is alert


def test_clears_when_flat_even_if_memory_is_not_returned():
    # the leak stops but what it kept is not released (or the allocator keeps it): flat again
    rng = random.Random(2)
    top = BASE + 152 * KIB * 50
    values = (noise(rng, 30, spikes=0) + [BASE + 152 * KIB * (i + 1) for i in range(50)]
              + [top + rng.gauss(0, 2 * KIB) for _ in range(40)])
    _, results = feed(values)
    (_, alert), (c_step, cleared) = results
    assert isinstance(cleared, LeakCleared) and c_step <= 81 + 8
    assert 80 <= cleared.since_step <= 82


def test_a_second_leak_after_a_fix_is_found_again():
    rng = random.Random(4)
    ramp = [BASE + 1 * MIB * (i + 1) for i in range(20)]
    values = noise(rng, 30, spikes=0) + ramp + noise(rng, 60, spikes=0) + ramp
    _, results = feed(values)
    kinds = [type(r).__name__ for _, r in results]
    assert kinds == ["LeakAlert", "LeakCleared", "LeakAlert"]
    assert results[2][1].since_step == 111


def test_a_gap_hides_a_jump_but_not_growth():
    rng = random.Random(6)
    detector = LeakDetector("host_heap")
    _, before = feed(noise(rng, 40, spikes=0), detector)
    detector.mark_gap()  # e.g. a profiler window allocated 30 MiB and kept caches
    _, after_gap = feed([v + 30 * MIB for v in noise(rng, 40, spikes=0)], detector, start=50)
    assert before == after_gap == []
    detector.mark_gap()
    _, ramp = feed([BASE + 200 * KIB * i for i in range(20)], detector, start=100)
    assert [type(r) for _, r in ramp] == [LeakAlert]


@pytest.mark.parametrize("kwargs,needle", [
    ({"min_steps": 0}, "min_steps must be a positive integer"),
    ({"window_steps": 3}, "window_steps (3) must be at least min_steps (4)"),
    ({"rising_fraction": 1.5}, "rising_fraction must be in (0, 1]"),
    ({"noise_mult": 0}, "noise_mult must be greater than zero"),
    ({"min_growth_bytes": -1}, "min_growth_bytes must be zero or a positive integer"),
])
def test_config_says_what_is_wrong(kwargs, needle):
    with pytest.raises(ValueError) as info:
        LeakDetectorConfig(**kwargs)
    assert needle in str(info.value)


def test_likely_cause_from_sizes():
    logits = 16 * 128 * 256 * 2  # the default run's bf16 logits: 1 MiB a step
    cause, hint = likely_cause("host_heap", 152 * KIB, logits)
    assert cause == "graph" and "likely" in hint and "loss.item()" in hint and "152" in hint
    cause, hint = likely_cause("host_heap", 1025 * KIB, logits)  # CPU: .cpu() would not help
    assert cause == "tensors" and "likely" in hint and "drop" in hint and ".cpu()" not in hint
    cause, hint = likely_cause("device_allocated", 1025 * KIB, logits)
    assert cause == "tensors" and ".cpu()" in hint
    assert likely_cause("device_allocated", 2 * MIB, logits)[1].count("2×") == 1
    assert likely_cause("device_allocated", 40 * KIB, logits)[0] == "tensors"
    assert likely_cause("host_heap", 44 * KIB, 32 * KIB)[0] == "graph"  # tiny model, 1 layer


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
