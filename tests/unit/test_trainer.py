"""The AMP loop on real torch: step order, skipped steps, finite checks, counters, control."""

from __future__ import annotations

import math
import threading

import pytest
from factories import RecordSink, in_thread, resolved_amp, wait_until

from probes.control.requests import RunControl
from probes.instruments.hooks import StepHook
from probes.records import STEP_FIELDS
from probes.runfolder import create_run_dir, read_metrics
from trainer.loop import Trainer


class PoisonGrad(StepHook):
    """Makes one parameter's gradient inf at the given steps: a real overflow, no mock."""

    def __init__(self, steps: set[int]) -> None:
        self.steps = steps
        self._handle = None

    def step_context(self, step):
        import contextlib

        @contextlib.contextmanager
        def ctx():
            param = next(self.ctx.model.parameters())
            handle = None
            if step in self.steps:
                handle = param.register_hook(lambda g: g * float("inf"))
            try:
                yield
            finally:
                if handle is not None:
                    handle.remove()

        return ctx()


def run_trainer(config, hooks=None, control=None):
    sink = RecordSink()
    run_dir = create_run_dir(config.run_dir)
    trainer = Trainer(config, run_dir, control=control, sinks=[sink], hooks=hooks or [])
    code = trainer.run() if control is None else None
    return trainer, sink, run_dir, code


def test_headless_run_writes_valid_rows_and_loss_falls(tiny_config):
    cfg = tiny_config(steps=60, lr=3e-3)
    trainer, sink, run_dir, code = in_thread(lambda: run_trainer(cfg))
    assert code == 0
    steps, events, bad = read_metrics(run_dir / "metrics.jsonl")
    assert bad == 0 and len(steps) == 60
    assert [s["step"] for s in steps] == list(range(1, 61))
    for row in steps:
        assert set(row) == set(STEP_FIELDS)
        assert row["allocated_bytes"] > 0
        assert row["reserved_bytes"] >= row["allocated_bytes"]
        assert row["peak_allocated_bytes"] >= row["allocated_bytes"]
        assert row["host_rss_bytes"] > 0 and row["driver_used_bytes"] == row["host_rss_bytes"]
        assert row["amp"] == resolved_amp(run_dir) and row["device"] == "cpu"
        assert row["scale"] is None
    # a hint depends on the machine (bf16 autocast on a CPU without native bf16) or its load
    # (the step split's: a loaded machine's optimizer phase): allowed, each once
    from probes.instruments.hints import SPLIT_HINTS

    hints = [e["hint"] for e in events if e["event"] == "hint"]
    assert set(hints) <= {"cpu_bf16_emulated", *SPLIT_HINTS} and len(set(hints)) == len(hints)
    # a quiet `workers` event may name children of this (pytest) process that other tests
    # started: another test's multiprocessing resource tracker lives as long as the worker
    assert [e["event"] for e in events if e["event"] not in ("hint", "workers")] == [
        "run_started", "weights_saved", "run_finished"]
    first = sum(s["loss"] for s in steps[:5]) / 5
    last = sum(s["loss"] for s in steps[-5:]) / 5
    assert last < first - 1.0, (first, last)
    assert (run_dir / "config.json").exists()


def test_clipping_sees_unscaled_gradients(tiny_config):
    """fp16 + GradScaler must report the same first-step gradient norm as an fp32 run."""
    ref = in_thread(lambda: run_trainer(tiny_config(steps=1, amp="off")))[1].samples[0]
    amp = in_thread(lambda: run_trainer(tiny_config(steps=1, amp="fp16")))[1].samples[0]
    assert amp.scale == 65536.0 and ref.scale is None
    # A scaled norm would be 65536x larger; fp16 rounding leaves a few percent at most.
    assert amp.grad_norm == pytest.approx(ref.grad_norm, rel=0.05)


def test_scaler_skips_and_counts_steps_with_inf_gradients(tiny_config):
    cfg = tiny_config(steps=6, amp="fp16")
    trainer, sink, run_dir, code = in_thread(lambda: run_trainer(cfg, [PoisonGrad({3, 5})]))
    assert code == 0
    skipped = [s.skipped_steps for s in sink.samples]
    assert skipped == [0, 0, 1, 1, 2, 2]
    scales = [s.scale for s in sink.samples]
    assert scales[2] == scales[1] / 2 and scales[4] == scales[3] / 2  # backoff on each overflow


def test_non_finite_gradients_without_scaler_fail_the_run(tiny_config):
    cfg = tiny_config(steps=5, amp="off")
    trainer, sink, run_dir, code = in_thread(lambda: run_trainer(cfg, [PoisonGrad({2})]))
    assert code == 1
    assert trainer.status.state == "failed"
    assert "gradient norm" in trainer.status.error
    steps, events, _ = read_metrics(run_dir / "metrics.jsonl")
    assert len(steps) == 1  # step 1 kept; the failing step is reported, not recorded as healthy
    error = next(e for e in events if e["event"] == "error")
    assert error["error_type"] == "NonFiniteError" and error["step"] == 2


def test_pause_stops_the_step_counter_and_stop_ends_the_thread(tiny_config):
    control = RunControl()
    cfg = tiny_config(steps=0)
    sink = RecordSink()
    trainer = Trainer(cfg, create_run_dir(cfg.run_dir), control=control, sinks=[sink])
    trainer.start()
    wait_until(lambda: len(sink.samples) >= 3, "the first steps")
    control.pause()
    wait_until(lambda: trainer.status.state == "paused", "the pause")  # after the step in flight
    paused_at = trainer.status.step
    control.resume()
    wait_until(lambda: trainer.status.step >= paused_at + 2, "steps after the resume")
    control.stop()
    assert trainer.join(timeout=30)
    assert trainer.exit_code == 0 and trainer.status.state == "stopped"
    assert not trainer.alive
    # no step ran while paused: nothing between the paused and resumed rows, whatever the speed
    kinds = [getattr(r, "event", "step") for r in sink.records]
    start = kinds.index("paused")
    assert kinds[start + 1] == "resumed"
    assert sink.records[start].step == paused_at
    assert sink.records[start + 1].data["paused_s"] > 0


def test_stop_while_paused_still_ends(tiny_config):
    control = RunControl()
    control.pause()
    cfg = tiny_config(steps=0)
    trainer = Trainer(cfg, create_run_dir(cfg.run_dir), control=control)
    trainer.start()
    wait_until(lambda: trainer.status.state == "paused", "the pause before step 1")
    control.stop()
    assert trainer.join(timeout=30)
    assert trainer.status.step == 0


def test_peak_is_reset_after_warmup(tiny_config):
    import contextlib

    import torch

    class Spike(StepHook):
        """A 64 MiB temporary inside step 2: a peak that only the steps before the reset see."""

        @contextlib.contextmanager
        def step_context(self, step):
            yield  # after the step's compute, before its sample
            if step == 2:
                t = torch.ones(64 << 20, dtype=torch.uint8)
                self.ctx.memory.observe_peak()
                del t

    cfg = tiny_config(steps=6, warmup_steps=3)
    _, sink, _, _ = in_thread(lambda: run_trainer(cfg, hooks=[Spike()]))
    peaks = [s.peak_allocated_bytes for s in sink.samples]
    step_peaks = [s.step_peak_allocated_bytes for s in sink.samples]
    assert all(sp >= s.allocated_bytes for sp, s in zip(step_peaks, sink.samples, strict=True))
    assert step_peaks[1] > step_peaks[0] + (60 << 20)  # the spike, in step 2's own peak
    # before the reset (after warmup step 3) the run's peak is the max since the start; after
    # it, the max of the per-step peaks since then: the spike has left it
    assert peaks[:3] == [max(step_peaks[:i + 1]) for i in range(3)]
    assert peaks[3:] == [max(step_peaks[3:i + 1]) for i in range(3, 6)]
    assert peaks[3] < peaks[2] - (60 << 20)
    assert all(math.isfinite(s.loss) for s in sink.samples)


def test_a_failing_sink_is_dropped_and_training_goes_on(tiny_config):
    def broken(record) -> None:
        raise BrokenPipeError("the reader went away")

    cfg = tiny_config(steps=5)
    sink = RecordSink()
    run_dir = create_run_dir(cfg.run_dir)
    trainer = Trainer(cfg, run_dir, sinks=[broken, sink])
    assert in_thread(trainer.run) == 0
    assert len(sink.samples) == 5 and broken not in trainer.sinks
    assert trainer.sink_errors == ["BrokenPipeError: the reader went away"]
    _, events, _ = read_metrics(run_dir / "metrics.jsonl")
    assert events[-1]["event"] == "run_finished" and events[-1]["reason"] == "finished"


def test_a_failed_assert_in_a_sink_fails_the_run_instead_of_hanging_it(tiny_config):
    """A test's check inside a sink must fail that test: with --steps 0 a dropped sink would
    leave the run training until the suite's timeout."""
    def check(record) -> None:
        assert getattr(record, "step", 0) < 3, "the check in the sink failed"

    cfg = tiny_config(steps=0)
    run_dir = create_run_dir(cfg.run_dir)
    trainer = Trainer(cfg, run_dir, sinks=[check])
    with pytest.raises(AssertionError, match="the check in the sink failed"):
        in_thread(trainer.run)
    assert trainer.exit_code == 1 and not trainer.alive
    _, events, _ = read_metrics(run_dir / "metrics.jsonl")
    assert [e["event"] for e in events][-2:] == ["error", "run_finished"]
    assert events[-2]["error_type"] == "AssertionError"


def test_fp16_on_cpu_uses_a_grad_scaler(tiny_config):
    cfg = tiny_config(steps=2, amp="fp16")
    _, sink, _, code = in_thread(lambda: run_trainer(cfg))
    assert code == 0 and all(s.scale == 65536.0 for s in sink.samples)


class _StuckStep(StepHook):
    """A step that never reaches its boundary while the test holds it (a rank's step waiting
    in a collective for a peer that died)."""

    def __init__(self, forwards: int) -> None:
        self.hold_at, self.forwards = forwards, 0
        self.inside = threading.Event()
        self.release = threading.Event()

    def setup(self, ctx) -> None:
        ctx.model.register_forward_hook(self._forward)

    def _forward(self, *_args) -> None:
        self.forwards += 1
        if self.forwards == self.hold_at:  # inside the step, as its all-reduce would be
            self.inside.set()
            self.release.wait(120)


def test_a_step_stuck_after_a_stop_is_sealed_as_failed_with_why(tiny_config):
    """trainer/rank.py's way out when torchrun's SIGTERM finds the step stuck: an error row that
    says why, run_finished "failed" (as when the collective raises), nothing written after."""
    import json

    cfg = tiny_config(steps=0)
    held = _StuckStep(3)
    trainer = Trainer(cfg, create_run_dir(cfg.run_dir), hooks=[held])
    trainer.start()
    try:
        assert held.inside.wait(60), "the held step"
        trainer.control.stop("interrupted (SIGTERM)")
        assert trainer.step_in_flight == 3
        assert trainer.abandon("interrupted (SIGTERM)", stuck="step 3 never finished")
        metrics = trainer.run_dir / "metrics.jsonl"
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        assert rows[-1]["event"] == "run_finished" and rows[-1]["reason"] == "failed"
        assert rows[-1]["abandoned_step"] == 3
        assert rows[-2]["event"] == "error" and rows[-2]["message"] == "step 3 never finished"
        assert [r["step"] for r in rows if "event" not in r] == [1, 2]  # in order, none lost
        sealed = metrics.read_text()
    finally:
        held.release.set()
    assert trainer.join(60)
    assert metrics.read_text() == sealed  # what the thread wrote later did not land
