"""The step split (issue 26): data wait, forward, backward, optimizer, other in every step row,
measured by hooks on a real loop; the hints it drives; the headless line and the report."""

from __future__ import annotations

import io
import json
import time

import pytest
import torch
from factories import in_thread, make_sample, metrics_rows

from probes.analysis.step_split import (
    PREDATES,
    excess_text,
    largest_phase,
    phase_excess,
    phase_medians,
    phase_stats,
    split_line,
    why_no_split,
)
from probes.instruments.hints import SPLIT_WINDOW, split_hints
from probes.instruments.phase_split import MAX_PENDING, PendingSplits, StepMarks, split_ms
from probes.monitor.monitor import Monitor
from probes.records import SPLIT_FIELDS

SLEEP_S = 0.005  # the floor a sleeping layer adds to its phase (never asserted as a ceiling)
# each step's forward sleeps this long: a step long enough that the loop's own hiccups between
# steps on a loaded machine (a GIL hand-off, a flush) stay far below 20% of the cycle
STEP_SLEEP_S = 0.01


class SlowBackward(torch.autograd.Function):
    """Identity whose backward sleeps: the backward ends only after the input-side layers."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(SLEEP_S)
        return grad


class Net(torch.nn.Module):
    def __init__(self, forward_sleep_s: float = 0.0) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)
        self.forward_sleep_s = forward_sleep_s

    def forward(self, x):
        if self.forward_sleep_s:
            time.sleep(self.forward_sleep_s)
        return self.b(torch.relu(self.a(SlowBackward.apply(x))))


def _run(tmp_path, loader_sleep_s: float = 0.0, steps: int = SPLIT_WINDOW + 4,
         micro: int = 1, forward_sleep_s: float = STEP_SLEEP_S):
    def run():
        model = Net(forward_sleep_s)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with Monitor(model, opt, run_dir=tmp_path, listen=False, profiler=False,
                     leak_watch=False, ledger=False, write_report=False,
                     warmup_steps=1) as mon:
            for _ in range(steps):
                time.sleep(loader_sleep_s)  # the loop's loader, outside the step
                x = torch.randn(8, 16, requires_grad=True)
                with mon.step() as s:
                    for _ in range(micro):
                        loss = model(x).pow(2).mean()
                        loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    s.set(loss=loss)
            return mon.run_dir
    rows, events = metrics_rows(in_thread(run))
    return rows, [e["hint"] for e in events if e["event"] == "hint"]


def test_a_sleeping_loader_is_the_largest_phase_and_the_hint_fires(tmp_path):
    rows, hints = _run(tmp_path, loader_sleep_s=0.02)
    for row in rows[1:]:  # the first step has no previous step to wait from
        split = {name: row[name] for name in SPLIT_FIELDS}
        assert all(v is not None for v in split.values()), split
        assert row["data_wait_ms"] >= 15.0  # the 20 ms sleep is a floor, never a ceiling
        assert row["split_step"] == row["step"]  # CPU: the step's own split
    # the pane shares out the recent steps' medians (tui/widgets/step_split.py): one step whose
    # backward a loaded machine stretched past 20 ms (CI did) does not change what it shows
    assert largest_phase(phase_medians(rows[1:])) == "data_wait_ms"
    assert rows[0]["data_wait_ms"] is None
    assert "input_bound" in hints and hints.count("input_bound") == 1


def test_without_the_sleep_no_input_hint(tmp_path):
    rows, hints = _run(tmp_path)
    assert all(r["forward_ms"] is not None and r["backward_ms"] is not None for r in rows)
    assert "input_bound" not in hints


def test_grad_accumulation_sums_forward_and_backward(tmp_path):
    """Each micro-batch's forward and backward sleep SLEEP_S: the phases hold all of them, and
    the backward ends after the input-side layer (the true end of the backward pass)."""
    micro = 3
    rows, _ = _run(tmp_path, steps=3, micro=micro, forward_sleep_s=SLEEP_S)
    for row in rows:
        assert row["micro_batches"] == micro
        assert row["forward_ms"] >= micro * SLEEP_S * 1000
        assert row["backward_ms"] >= micro * SLEEP_S * 1000
        inside = row["forward_ms"] + row["backward_ms"] + row["optimizer_ms"] + row["other_ms"]
        assert inside <= row["step_ms"] * (1 + 1e-9)  # the parts lie inside the step's span


def test_a_step_without_the_model_has_no_forward_and_says_why(tmp_path):
    def run():
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with Monitor(model, opt, run_dir=tmp_path, listen=False, profiler=False,
                     leak_watch=False, ledger=False, write_report=False) as mon:
            for _ in range(3):
                with mon.step():
                    opt.step()
            return mon.run_dir
    rows, _ = metrics_rows(in_thread(run))
    assert all(r["forward_ms"] is None and r["backward_ms"] is None for r in rows)
    assert all(r["optimizer_ms"] is not None for r in rows)
    why = why_no_split(rows)
    assert set(why) == {"forward_ms", "backward_ms"} and "not called" in why["forward_ms"]
    old = [{k: v for k, v in r.items() if k not in SPLIT_FIELDS} for r in rows]
    assert set(why_no_split(old).values()) == {PREDATES}


def test_step_split_off_writes_null_phases(tmp_path):
    def run():
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with Monitor(model, opt, run_dir=tmp_path, listen=False, profiler=False,
                     leak_watch=False, ledger=False, write_report=False,
                     step_split=False) as mon:
            for _ in range(2):
                with mon.step():
                    model(torch.ones(1, 4)).sum().backward()
            return mon.run_dir
    rows, _ = metrics_rows(in_thread(run))
    assert all(r[name] is None for r in rows for name in SPLIT_FIELDS)


def test_memtops_trainer_parts_sum_to_the_step(tiny_config, tmp_path):
    """The trainer on CPU: forward + backward + optimizer + other is the step within 5%, and the
    headless output carries the split on a line of its own (≤ 80 columns)."""
    from probes.runfolder import create_run_dir
    from tui.headless import run_headless

    config = tiny_config(steps=6)
    out = io.StringIO()
    run_dir = create_run_dir(config.run_dir)
    assert run_headless(config, run_dir, log_every=2, out=out) == 0
    rows, _ = metrics_rows(run_dir)
    assert len(rows) == 6
    for row in rows:
        parts = sum(row[n] for n in ("forward_ms", "backward_ms", "optimizer_ms", "other_ms"))
        assert abs(parts - row["step_ms"]) <= 0.05 * row["step_ms"], row  # exact but rounding
        assert row["forward_ms"] > 0 and row["backward_ms"] > 0 and row["optimizer_ms"] > 0
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("  split")]
    assert len(lines) >= 3 and all(len(ln) <= 80 for ln in lines)
    assert "fwd" in lines[0] and "bwd" in lines[0] and "opt" in lines[0]
    report = json.loads((run_dir / "report.json").read_text())
    phases = report["step_split"]["phases"]
    assert phases["forward_ms"]["median_ms"] > 0 and phases["backward_ms"]["p95_ms"] > 0
    assert "## Where the step went" in (run_dir / "report.md").read_text()


# --- pure parts ------------------------------------------------------------------------------
def _marks(step=1, **intervals):
    m = StepMarks(step, start=1.0, left_before=0.5, end=2.0)
    for name, pairs in intervals.items():
        m.intervals[name] = pairs
    return m


def _host(a, b):
    return (b - a) * 1000.0


def test_split_arithmetic_sums_intervals_and_clamps_other():
    m = _marks(forward_ms=[(1.0, 1.1), (1.3, 1.4)], backward_ms=[(1.1, 1.3)],
               optimizer_ms=[(1.5, 1.6)])
    got = split_ms(m, _host)
    assert got["data_wait_ms"] == pytest.approx(500.0)
    assert got["forward_ms"] == pytest.approx(200.0) and got["backward_ms"] == pytest.approx(200)
    assert got["other_ms"] == pytest.approx(1000.0 - 500.0)
    over = split_ms(_marks(forward_ms=[(0.0, 3.0)]), _host)  # a hook outside the step's span
    assert over["other_ms"] == 0.0 and over["optimizer_ms"] is None


def test_pending_cuda_steps_are_read_once_done_and_never_waited_on():
    """Stand-ins for CUDA events: a mark is done when its value is in ``done``."""
    done: set[float] = set()
    queue = PendingSplits(elapsed_ms=_host, ready=lambda mark: mark in done)
    queue.add(_marks(1))
    assert queue.take() is None  # still running: no wait, no row split
    done.update({2.0})  # the end: the step's earlier marks are done too (stream order)
    step, fields, span = queue.take()
    assert step == 1 and fields["data_wait_ms"] == pytest.approx(500.0)
    assert span == pytest.approx(1000.0)  # start to end: the row's step_ms on CUDA
    for step in range(MAX_PENDING + 2):
        queue.add(StepMarks(step, start=10.0 + step))
    assert len(queue.queue) == MAX_PENDING and queue.dropped == 2


def test_split_hints_from_samples():
    base = dict(step_ms=10.0, forward_ms=3.0, backward_ms=5.0, optimizer_ms=1.0, other_ms=1.0)
    calm = [make_sample(i, data_wait_ms=0.5, **base) for i in range(SPLIT_WINDOW)]
    assert split_hints(calm, optimizer_fast=False) == []
    assert split_hints(calm[:-1], optimizer_fast=False) == []  # not a full window yet
    starved = [make_sample(i, data_wait_ms=8.0, **base) for i in range(SPLIT_WINDOW)]
    assert [n for n, _ in split_hints(starved, False)] == ["input_bound"]
    assert "already" not in split_hints(starved, False)[0][1]
    # a loop that has workers is not told to get some (user pass)
    fed = [make_sample(i, data_wait_ms=8.0, workers=2, **base) for i in range(SPLIT_WINDOW)]
    ((name, detail),) = split_hints(fed, False)
    assert name == "input_bound" and "with 2 DataLoader workers already" in detail
    slow_opt = {**base, "optimizer_ms": 6.0}
    rows = [make_sample(i, data_wait_ms=0.5, **slow_opt) for i in range(SPLIT_WINDOW)]
    assert [n for n, _ in split_hints(rows, False)] == ["optimizer_bound"]
    assert split_hints(rows, optimizer_fast=True) == []
    idle = [make_sample(i, data_wait_ms=0.5, gpu_util_pct=20.0, device="cuda:0", **base)
            for i in range(SPLIT_WINDOW)]
    assert [n for n, _ in split_hints(idle, False)] == ["gpu_idle"]
    cpu = [make_sample(i, data_wait_ms=0.5, gpu_util_pct=20.0, **base)
           for i in range(SPLIT_WINDOW)]
    assert split_hints(cpu, False) == []


def test_stats_line_and_straggler_phase():
    rows = [make_sample(i, data_wait_ms=float(i), forward_ms=2.0, backward_ms=4.0,
                        optimizer_ms=1.0, other_ms=1.0) for i in range(1, 21)]
    stats = phase_stats(rows)
    assert stats["data_wait_ms"]["median_ms"] == pytest.approx(10.5)
    assert stats["data_wait_ms"]["p95_ms"] > stats["data_wait_ms"]["median_ms"]
    assert sum(s["share"] for s in stats.values()) == pytest.approx(1.0)
    line = split_line(rows[-1])
    assert line.startswith("  split  wait 20.0 ms  fwd 2.0 ms") and len(line) <= 80
    assert split_line(make_sample(1)) is None
    medians = {0: {"data_wait_ms": 1.0, "forward_ms": 5.0}, 1: {"data_wait_ms": 39.0,
                                                                  "forward_ms": 5.5},
               2: {"data_wait_ms": 1.0, "forward_ms": 5.0}}
    assert excess_text(phase_excess(medians)) == "rank 1: +38 ms in data wait"
    ddp = {0: {"data_wait_ms": 1.0, "backward_ms": 45.0}, 1: {"data_wait_ms": 39.0,
                                                              "backward_ms": 5.0}}
    assert phase_excess(ddp)[:2] == (1, "data_wait_ms")  # rank 0 waits in backward for it
    assert phase_excess({0: {}}) is None and excess_text(None) is None
