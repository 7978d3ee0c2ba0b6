"""Faults injected for real in a trainer of this process: a raise in the step, inf loss, a full
disk, a memory cap, a stop inside a profiler window (signals and exit codes of a headless
process: tests/integration/test_headless_process.py)."""

from __future__ import annotations

import contextlib
import os
import re

import torch
from factories import RecordSink, in_thread

from probes.control.requests import RunControl
from probes.counters.memory import RssReader
from probes.instruments.hooks import StepHook
from probes.runfolder import create_run_dir, read_metrics
from trainer.loop import Trainer


class AtStep(StepHook):
    """Runs ``action(model)`` inside the given step's compute."""

    def __init__(self, step: int, action) -> None:
        self.step, self.action = step, action

    def step_context(self, step):
        if step == self.step:
            self.action(self.ctx.model)
        return contextlib.nullcontext()


def _run(config, hooks=(), control=None):
    sink = RecordSink()
    run_dir = create_run_dir(config.run_dir)
    trainer = Trainer(config, run_dir, control=control, sinks=[sink], hooks=list(hooks))
    in_thread(trainer.run)
    return trainer, sink, run_dir


def _raise(_model):
    raise RuntimeError("boom inside the step")


def test_exception_in_the_step_is_caught_and_recorded(tiny_config):
    trainer, sink, run_dir = _run(tiny_config(steps=10), [AtStep(3, _raise)])
    assert trainer.exit_code == 1 and trainer.status.state == "failed"
    assert "boom inside the step" in trainer.status.error
    steps, events, bad = read_metrics(run_dir / "metrics.jsonl")
    assert [s["step"] for s in steps] == [1, 2] and bad == 0
    error = next(e for e in events if e["event"] == "error")
    assert error["error_type"] == "RuntimeError" and "Traceback" in error["traceback"]
    assert events[-1] == {**events[-1], "event": "run_finished", "reason": "failed"}
    assert any(getattr(e, "event", "") == "error" for e in sink.events)  # the UI hears it too


def _poison_weights(model):
    with torch.no_grad():
        model.transformer.ln_f.weight.fill_(float("inf"))


def test_inf_loss_without_amp_fails_with_a_clear_error(tiny_config):
    trainer, _, run_dir = _run(tiny_config(steps=10, amp="off"), [AtStep(4, _poison_weights)])
    assert trainer.exit_code == 1
    assert "loss became nan at step 4" in trainer.status.error
    steps, _, _ = read_metrics(run_dir / "metrics.jsonl")
    assert len(steps) == 3


def test_full_disk_stops_cleanly_and_keeps_the_ui_informed(tiny_config):
    cfg = tiny_config(steps=50)
    run_dir = create_run_dir(cfg.run_dir)
    os.symlink("/dev/full", run_dir / "metrics.jsonl")  # every write fails with ENOSPC
    sink = RecordSink()
    trainer = Trainer(cfg, run_dir, sinks=[sink])
    in_thread(trainer.run)
    assert trainer.exit_code == 1 and trainer.write_failed
    assert "No space left on device" in trainer.status.stop_reason
    assert any(e.event == "metrics_write_failed" for e in sink.events)
    assert len(sink.samples) <= 1  # it stopped at the first step boundary


def test_memory_guard_stops_a_leak_before_the_limit(tiny_config):
    rss = RssReader()
    limit = rss.read() + 160 * 1024 * 1024  # above what set-up adds in a fresh process
    cfg = tiny_config(steps=400, batch_size=64, seq_len=32, leak="logits", leak_at=3,
                      max_memory_bytes=limit)
    trainer, sink, run_dir = _run(cfg)
    assert trainer.exit_code == 3  # trainer/exit_codes.py: a CI job sees the guard's stop
    assert trainer.status.stop_reason.startswith("memory guard")
    reason = trainer.status.stop_reason  # in units (a worker's RSS may be MiB or GiB)
    assert " bytes" not in reason
    # ahead of the limit, or (one chunk of RSS within a step) just past it, said as such
    assert (re.search(r"at \d+(\.\d)? [MG]iB \(\+\d.*\) would pass", reason)
            and re.search(r"next step \(\d+(\.\d)? (B|KiB|MiB) left\)", reason)) or (
        re.search(r"at \d+(\.\d)? [MG]iB passed --max-memory", reason)
        and re.search(r"this step \(\d+(\.\d)? (B|KiB|MiB) over; \+\d", reason)), reason
    assert len(sink.samples) < 400
    _, events, _ = read_metrics(run_dir / "metrics.jsonl")
    guard = next(e for e in events if e["event"] == "memory_guard")
    assert guard["limit_bytes"] == limit and guard["growth_bytes_per_step"] > 0
    # it stopped at the step whose growth would carry it past the limit, not later
    last = sink.samples[-1]
    assert last.step == guard["step"]
    assert last.host_rss_bytes + guard["growth_bytes_per_step"] > limit
    assert sink.samples[-2].host_rss_bytes <= limit


def test_a_limit_the_run_is_already_over_stops_it_before_the_first_step(tiny_config):
    """--max-memory below what the process holds before step 1: no step, no weights, the
    reason in units, exit status 3 (README, "When things go wrong")."""
    cfg = tiny_config(steps=20, max_memory_bytes=1024)
    trainer, sink, run_dir = _run(cfg)
    assert trainer.exit_code == 3 and sink.samples == []
    reason = trainer.status.stop_reason
    assert "before the first step" in reason and "1.0 KiB" in reason
    assert "nothing was trained" in reason
    assert not (run_dir / "weights.pt").exists()
    events = [e["event"] for e in read_metrics(run_dir / "metrics.jsonl")[1]]
    assert events.index("memory_guard") < events.index("run_finished")


def test_stop_during_a_profiler_window_closes_it_before_run_finished(tiny_config):
    from probes.monitor import default_hooks

    cfg = tiny_config(steps=0, profile_at=[3], profile_active=50)
    control = RunControl()
    sink = RecordSink()

    def stop_at_8(record) -> None:
        if getattr(record, "step", 0) == 8 and hasattr(record, "tokens_per_s"):
            assert record.profiling  # the window is open at this step
            control.stop("quit during a profiler window")

    run_dir = create_run_dir(cfg.run_dir)
    trainer = Trainer(cfg, run_dir, control=control, sinks=[sink, stop_at_8],
                      hooks=default_hooks(**cfg.hook_options()))
    assert in_thread(trainer.run) == 0
    assert not torch.autograd.profiler._is_profiler_enabled
    _, events, bad = read_metrics(run_dir / "metrics.jsonl")
    names = [e["event"] for e in events]
    assert bad == 0 and names[-1] == "run_finished"
    assert "profile_started" in names and "profile_cancelled" in names
    assert names.index("profile_cancelled") < names.index("run_finished")
