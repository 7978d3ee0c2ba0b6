"""The CUDA step path's logic on CPU (issue 45), with no GPU and no mock of torch: the device
index every per-device call gets, the ring of timing events and the queue that reads them when
done, and the step time taken from the device's clock (the step's values at one wait:
test_cuda_step_values.py).

What stands in for CUDA here is a small event class of the test's own (record / query /
elapsed_time over a device clock the test moves), given to the same classes the CUDA path
builds around torch.cuda.Event; whether torch's events behave so is the GPU claims' part
(benchmarks/gpu/claims/profiler.py, split.py)."""

from __future__ import annotations

import pytest
import torch
from factories import in_thread

from probes.counters.device_index import device_index, indexed_device
from probes.instruments.phase_split import RING_EVENTS, EventRing, PendingSplits, StepMarks
from probes.instruments.phases import PhaseClock
from probes.monitor.monitor import Monitor
from probes.records import STEP_CLOCK_CUDA, STEP_CLOCK_HOST, step_clock


# ---- the device index -----------------------------------------------------------------------
def test_a_cuda_device_without_an_index_gets_the_current_one():
    """torch.cuda.set_per_process_memory_fraction(f, torch.device("cuda")) raised "Expected a
    torch.device with a specified index" on the H200 (all five OOM claims): every device is
    normalised once, the current index filling in as torch itself would."""
    current = lambda: 2  # noqa: E731  (torch.cuda.current_device on a machine with 3 GPUs)
    assert indexed_device("cuda", current) == torch.device("cuda", 2)
    assert indexed_device(torch.device("cuda"), current) == torch.device("cuda", 2)
    assert indexed_device("cuda:1", current) == torch.device("cuda", 1)
    assert indexed_device(torch.device("cuda", 0), current) == torch.device("cuda", 0)
    assert indexed_device(3) == torch.device("cuda", 3)
    assert indexed_device("cpu") == torch.device("cpu")
    assert device_index("cuda", current) == 2 and device_index("cuda:0") == 0
    with pytest.raises(ValueError, match="not a CUDA device"):
        device_index("cpu")
    with pytest.raises(ValueError):
        indexed_device(-1)


def test_the_gpu_claims_hand_torch_indexed_devices(tmp_path):
    """Every claim gets its device from Ctx.torch_device (indexed), never torch.device(ctx.device)
    with "cuda" in it (what the OOM claims' set-up passed)."""
    import re

    from factories import ROOT, import_benchmark

    reg = import_benchmark("gpu.registry")
    ctx = reg.Ctx(tmp_path, "cuda:1", 0.0)
    assert ctx.torch_device == torch.device("cuda", 1)
    assert reg.Ctx(tmp_path, "cpu", 0.0).torch_device == torch.device("cpu")
    unindexed = re.compile(r"torch\.device\((self\.)?ctx\.device\)|torch\.device\(\"cuda\"\)")
    for path in sorted((ROOT / "benchmarks" / "gpu" / "claims").glob("*.py")):
        assert not unindexed.search(path.read_text()), path.name


# ---- a device clock of the test's own ----------------------------------------------------------
class Stream:
    """Where the test's device is: each recorded event lands ``per_mark_ms`` after the last
    (the work queued between two marks); the device has reached ``done_ms``."""

    def __init__(self, per_mark_ms: float = 1.0) -> None:
        self.cursor_ms = 0.0
        self.done_ms = float("inf")  # caught up (as after a sync)
        self.per_mark_ms = per_mark_ms
        self.recorded = 0


class Event:
    """record / query / elapsed_time as torch.cuda.Event answers them: elapsed_time refuses an
    event the device has not reached (cudaErrorNotReady)."""

    made = 0

    def __init__(self) -> None:
        Event.made += 1
        self.at_ms: float | None = None
        self.stream: Stream | None = None

    def record(self, stream: Stream) -> None:
        stream.cursor_ms += stream.per_mark_ms
        stream.recorded += 1
        self.at_ms, self.stream = stream.cursor_ms, stream

    def query(self) -> bool:
        return self.stream is not None and self.stream.done_ms >= self.at_ms

    def elapsed_time(self, end: Event) -> float:
        if not (self.query() and end.query()):
            raise RuntimeError("not ready")
        return end.at_ms - self.at_ms


def event_clock(stream: Stream, size: int = RING_EVENTS) -> tuple[EventRing, PendingSplits]:
    """The ring and queue exactly as probes/instruments/phases.py cuda_clock builds them,
    over the test's events."""
    ring = EventRing(Event, Event.record, stream, size)
    return ring, PendingSplits(Event.elapsed_time, Event.query, release=ring.give_back)


# ---- the ring and the queue -----------------------------------------------------------------
def test_the_ring_records_made_events_on_its_stream_and_takes_them_back():
    stream = Stream()
    ring = EventRing(Event, Event.record, stream, size=3)
    a, b, c = ring.mark(), ring.mark(), ring.mark()
    assert ring.free == 0 and ring.made == 3 and stream.recorded == 3
    assert (a.at_ms, b.at_ms, c.at_ms) == (1.0, 2.0, 3.0) and a.stream is stream
    d = ring.mark()  # every event out: one more is made, and kept
    assert ring.made == 4 and d not in (a, b, c)
    ring.give_back([a, b, c, d])
    again = {id(ring.mark()) for _ in range(4)}
    assert again == {id(a), id(b), id(c), id(d)} and ring.made == 4  # reused, none made


def test_the_queue_asks_only_the_end_and_gives_the_events_back_once_read():
    """One query a step (events complete in stream order); a read or dropped step's events
    go back to the ring; never a wait."""
    stream = Stream()
    ring, queue = event_clock(stream, size=8)
    marks = StepMarks(1, ring.mark(), left_before=None)
    marks.intervals["forward_ms"].append((ring.mark(), ring.mark()))
    marks.end = ring.mark()
    stream.done_ms = 3.0  # the device is inside the step: its end not reached
    queue.add(marks)
    asked: list[Event] = []
    queue.ready = lambda m: asked.append(m) or Event.query(m)
    assert queue.take() is None and asked == [marks.end] and ring.free == 4
    stream.done_ms = 4.0
    step, fields, span = queue.take()
    assert step == 1 and span == pytest.approx(3.0) and fields["forward_ms"] == pytest.approx(1)
    assert fields["other_ms"] == pytest.approx(2.0) and ring.free == 8
    stream.done_ms = 0.0  # a device far behind: steps beyond MAX_PENDING are given up
    for step in range(2, 9):
        m = StepMarks(step, ring.mark())
        m.end = ring.mark()
        queue.add(m)
    assert queue.dropped == 3 and ring.free + 2 * len(queue.queue) == ring.made


# ---- the event path of the step clock on a real loop ----------------------------------------
def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _step(model, opt, x, scope=None):
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if scope is not None:
        scope.set(loss=loss)
    return loss


def test_the_clock_marks_a_step_from_the_ring_and_reuses_its_events(tmp_path):
    """A PhaseClock on the event path, on a real model and optimizer: each step's marks come
    from the ring (none made after the first steps), ``stop`` stamps the end before the step's
    values are read, and a device that keeps up gives each step its own split and span."""
    def run():
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        stream = Stream(per_mark_ms=1.0)
        ring, queue = event_clock(stream, size=16)
        clock = PhaseClock(model, opt, torch.device("cpu"), events=(ring, queue))
        x = torch.randn(4, 8)
        got = []
        for step in range(1, 41):
            clock.begin(step, 0.0)
            _step(model, opt, x)
            clock.stop()
            got.append((clock.end(1.0), clock.span_ms))
            clock.left()
        clock.close()
        return got, ring
    got, ring = in_thread(run)
    # marks: start, forward start and end, backward end, optimizer start and end, end (1 ms each)
    for (split, span), step in zip(got, range(1, 41), strict=True):
        wait, fwd, bwd, opt_ms, other, split_step = split
        assert split_step == step and span == pytest.approx(6.0)
        assert (fwd, bwd, opt_ms, other) == pytest.approx((1.0, 1.0, 1.0, 3.0))
        assert wait == (None if step == 1 else pytest.approx(1.0))  # left → start
    assert ring.made == 16  # 8 marks a step, each step's back in the ring once read


def test_a_device_behind_the_host_is_read_later_and_never_waited_for():
    stream = Stream()
    ring, queue = event_clock(stream, size=4)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    clock = PhaseClock(model, opt, torch.device("cpu"), events=(ring, queue))
    x = torch.randn(4, 8)
    stream.done_ms = 0.0
    rows = []
    for step in range(1, 7):
        clock.begin(step, 0.0)
        _step(model, opt, x)
        clock.stop()
        if step >= 3:
            stream.done_ms = (step - 2) * 8.0  # two steps behind (8 marks a step)
        rows.append((clock.end(1.0), clock.span_ms))
        clock.left()
    assert rows[0] == (None, None) and rows[1] == (None, None)
    assert [r[0][-1] for r in rows[2:]] == [1, 2, 3, 4]  # split_step: the step measured
    assert all(r[1] == pytest.approx(6.0) for r in rows[2:])
    assert ring.made > 4  # the events of steps in flight are not reused meanwhile
    clock.close()


def test_a_step_that_raised_and_a_pause_give_their_events_back():
    stream = Stream()
    ring, queue = event_clock(stream, size=8)
    clock = PhaseClock(_model(), torch.optim.SGD(_model().parameters(), lr=0.1),
                       torch.device("cpu"), events=(ring, queue))
    clock.begin(1, 0.0)
    clock.left()  # the step raised: the Monitor's _step_failed → forget_left
    clock.forget_left()
    clock.begin(2, 0.0)  # its start mark goes back; a new step begins
    clock.stop()
    clock.end(1.0)
    assert ring.free == ring.made == 8


# ---- the row's step time on the device clock ---------------------------------------------------
def test_on_the_event_clock_a_rows_step_time_is_the_devices(tmp_path):
    """The Monitor's rows from the event path (the clock CUDA runs use, over the test's
    events): step_ms is the measured step's span on the device (6 marks of 1 ms, not the
    host's time), tokens/s follows it, split_step names the step, and the row's clock is
    the device's once run_started says the run timed steps with CUDA events."""
    def run():
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        stream = Stream(per_mark_ms=1.0)
        with Monitor(model, opt, tokens_per_step=400, run_dir=tmp_path, listen=False,
                     profiler=False, ledger=False, write_report=False, warmup_steps=1) as mon:
            mon.phases.close()  # the CPU clock's hooks off; the event clock's on, as on CUDA
            mon.phases = PhaseClock(model, opt, torch.device("cpu"), own_forward_hook=False,
                                    events=event_clock(stream))
            mon._before_wait = True  # the CUDA order: allocator read and batch before the wait
            x = torch.randn(4, 8)
            samples = []
            for step in range(1, 13):
                stream.done_ms = 0.0 if step <= 2 else float("inf")
                with mon.step() as s:
                    _step(model, opt, x, s)
                samples.append(s.sample)
            run_dir = mon.run_dir
        return samples, run_dir
    samples, run_dir = in_thread(run)
    from factories import metrics_rows

    rows, _events = metrics_rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 13))  # every row written, in order
    cuda = {"step_clock": STEP_CLOCK_CUDA}
    first, second = samples[:2]
    assert first.split_step is None and step_clock(first, cuda) == STEP_CLOCK_HOST
    assert second.split_step is None  # the device behind: host time, and the row says so
    third = samples[2]  # steps 1-3 done at once: the newest is read, the older left out
    assert third.split_step == 3 and third.step_ms == pytest.approx(6.0)
    for s in samples[2:]:
        assert s.split_step == s.step and s.step_ms == pytest.approx(6.0)
        assert s.tokens_per_s == pytest.approx(400 / 0.006)
        assert step_clock(s, cuda) == STEP_CLOCK_CUDA
        assert step_clock(s, {"step_clock": STEP_CLOCK_HOST}) == STEP_CLOCK_HOST
        assert step_clock(s, {}) == STEP_CLOCK_HOST  # a run written before issue 45


def test_a_cpu_run_stays_on_the_host_clock_and_says_so(tmp_path):
    from factories import events_named

    def run():
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with Monitor(model, opt, run_dir=tmp_path, listen=False, profiler=False, ledger=False,
                     write_report=False) as mon:
            x = torch.randn(4, 8)
            for _ in range(3):
                with mon.step() as s:
                    _step(model, opt, x, s)
            return mon.run_dir
    run_dir = in_thread(run)
    started = events_named(run_dir, "run_started")[0]
    assert started["step_clock"] == STEP_CLOCK_HOST
    from probes.analysis.report.build import build_report
    from probes.analysis.report.sections.setup import CUDA_TIMING, TIMING, timing_rule

    assert build_report(run_dir)["measurement"]["timing"] == TIMING
    assert timing_rule({"step_clock": STEP_CLOCK_CUDA}) == CUDA_TIMING
    assert timing_rule({}) == TIMING  # a run written before issue 45
