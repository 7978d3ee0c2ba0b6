"""The CUDA step path's logic on CPU (issue 45), continued from test_cuda_hot_path.py: the step's
values read through slots made once at one wait, each step's its own; the host heap read on
CUDA at its budgeted rate; the graph demo keeping its graph; earlier rows published before the
wait. No GPU and no mock of torch."""

from __future__ import annotations

import pytest
import torch
from factories import in_thread

from probes.monitor.monitor import Monitor
from probes.monitor.stepvalues import StepValueReader, read_step_values


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


# ---- the step's values at one wait -----------------------------------------------------------
def test_values_are_read_through_slots_made_once():
    """The slot path (CUDA's: copies into a host buffer made once, one wait, one read), run on
    CPU tensors: each value lands in its own place, None and numbers pass through, a value of
    several elements gives its first, an empty one None, a half-precision one its value."""
    reader = StepValueReader(slot_devices=("cpu",))
    loss = torch.tensor(2.5, dtype=torch.bfloat16)
    got, synced = reader.read(loss, None, torch.tensor([3.0, 4.0]), 7, torch.tensor([1.5]))
    assert got == [2.5, None, 3.0, 7.0, 1.5] and synced
    buffer = reader._slots[torch.device("cpu")][0]
    for value in (1.0, 2.0, float("inf")):
        got, _ = reader.read(torch.tensor(value), torch.tensor(value * 2, dtype=torch.float16))
        assert got == [value, value * 2]
    assert reader._slots[torch.device("cpu")][0] is buffer  # made once, not per step
    assert reader.read(torch.tensor([]), None) == ([None, None], False)  # nothing to wait for
    assert read_step_values(torch.tensor(2.0), None, 3) == ([2.0, None, 3.0], False)


def test_the_value_of_each_step_is_its_own(tmp_path):
    """The loss, gradient norm and scale a row shows belong to the step it is the row of
    (issue 45): an fp16 CPU run with a real GradScaler, each step's values kept by the loop
    and compared with its row."""
    def run():
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
        mine = []
        with Monitor(model, opt, scaler=scaler, run_dir=tmp_path, listen=False, profiler=False,
                     ledger=False, write_report=False, amp="fp16") as mon:
            for step in range(1, 11):
                x = torch.randn(16, 8) * (1e6 if step == 5 else 1.0)  # an overflow at step 5
                with mon.step() as s:
                    with torch.autocast("cpu", dtype=torch.float16):
                        loss = model(x).float().pow(2).mean()
                    scaler.scale(loss).backward()
                    scaler.unscale_(opt)
                    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
                    scaler.step(opt)
                    scaler.update()
                    opt.zero_grad(set_to_none=True)
                    s.set(loss=loss, grad_norm=norm)
                mine.append((loss.item(), norm.item(), scaler.get_scale(), s.sample))
        return mine
    for loss, norm, scale, row in in_thread(run):
        assert row.loss == pytest.approx(loss, nan_ok=True)
        assert row.grad_norm == pytest.approx(norm, nan_ok=True)
        assert row.scale == scale


# ---- the host heap on CUDA and the graph demo ------------------------------------------------
def test_a_cuda_probe_reads_the_host_heap_at_its_budgeted_rate():
    """A CUDA-configured memory probe (built here without a GPU: the allocator's figures read
    None, nothing raises) reads the host heap at the step's end for the leak watch: on the
    first step, then every k-th, k what keeps one read within CUDA_HEAP_READ_BUDGET of the
    step (never more than CUDA_HEAP_READ_MAX_EVERY apart)."""
    from probes.counters import memory as mem

    quiet = mem.MemoryProbe(torch.device("cuda", 0))  # no instrument wants the heap
    quiet.begin_step()
    assert quiet.read().host_heap_bytes is None and quiet.host_heap_reads == 0
    quiet.close()
    probe = mem.MemoryProbe(torch.device("cuda", 0), host_heap=True)
    assert probe.device == torch.device("cuda", 0) and probe.is_cuda
    readings = []
    for _ in range(40):
        probe.begin_step()
        readings.append(probe.read())
    probe.close()
    assert readings[0].allocated_bytes is None  # no CUDA here: n/a, not an error
    read_at = [i for i, r in enumerate(readings) if r.host_heap_bytes is not None]
    assert read_at[0] == 0 and probe.host_heap_reads == len(read_at)
    gaps = [b - a for a, b in zip(read_at, read_at[1:], strict=False)]
    assert max(gaps) <= mem.CUDA_HEAP_READ_MAX_EVERY
    # the rule itself: cheap reads every step, a slow one spread within the budget
    assert mem.heap_read_every(4e-6, 0.009, mem.CUDA_HEAP_READ_FLOOR_S,
                               mem.CUDA_HEAP_READ_BUDGET, mem.CUDA_HEAP_READ_MAX_EVERY) == 1
    assert mem.heap_read_every(55e-6, 0.009, mem.CUDA_HEAP_READ_FLOOR_S,
                               mem.CUDA_HEAP_READ_BUDGET, mem.CUDA_HEAP_READ_MAX_EVERY) == 4
    assert mem.heap_read_every(1e-3, 0.001, mem.CUDA_HEAP_READ_FLOOR_S,
                               mem.CUDA_HEAP_READ_BUDGET, mem.CUDA_HEAP_READ_MAX_EVERY) == 8


def test_the_graph_demo_on_cuda_keeps_its_graph_and_saved_activations():
    """On CUDA the graph demo's backward retains its graph (trainer/leaks.py): the kept loss
    then still holds its saved activations (a second backward through it works), as real
    graph leaks on a GPU do; on CPU (and off) it stays the ordinary backward."""
    from trainer.leaks import LEAK_HINTS, RETAINED_GRAPH_HINT, LeakInjector

    demo = LeakInjector("graph", device_type="cuda")
    assert not demo.retain_graph  # not started
    demo.start(3)
    assert demo.retain_graph and demo.hint == RETAINED_GRAPH_HINT
    assert not LeakInjector("logits", "cuda").retain_graph
    cpu = LeakInjector("graph", "cpu")
    cpu.start(3)
    assert not cpu.retain_graph and cpu.hint == LEAK_HINTS["graph"]

    model = _model()
    for injector, kept_graph in ((demo, True), (cpu, False)):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward(retain_graph=injector.retain_graph)
        injector.keep(loss, loss)
        if kept_graph:
            injector.kept[-1].backward()  # the saved tensors are still there
        else:
            with pytest.raises(RuntimeError, match="second time"):
                injector.kept[-1].backward()
    demo.stop()
    assert not demo.retain_graph


def test_the_monitor_reads_the_host_heap_for_an_instrument_that_watches_it(tmp_path):
    def run(leak_watch):
        model = _model()
        with Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=tmp_path,
                     listen=False, profiler=False, ledger=False, write_report=False,
                     leak_watch=leak_watch) as mon:
            return mon.memory.host_heap
    assert in_thread(run, True) is True and in_thread(run, False) is False


def test_a_cuda_monitor_publishes_earlier_rows_before_its_wait(tmp_path):
    """The rows' batch on CUDA runs before the step's one wait (drain_if_due), never after it
    (publish_soon(drain=False)): at most MAX_SOON_ROWS rows wait, in order, and an event still
    publishes the rows before it first."""
    from factories import make_sample

    from probes.runfolder.recorder import MAX_SOON_ROWS, RunRecorder

    got: list = []
    rec = RunRecorder(tmp_path, sinks=[got.append])
    rec._drained_at = float("inf")  # the clock never makes a batch due here: only the count
    for step in range(1, MAX_SOON_ROWS):
        rec.publish_soon(make_sample(step), drain=False)
        assert rec.rows_waiting == step and not got
        if step < MAX_SOON_ROWS - 1:
            rec.drain_if_due()
            assert not got
    rec.drain_if_due()  # 7 waiting: the 8th would be over the cap, so they go now
    assert [r.step for r in got] == list(range(1, MAX_SOON_ROWS)) and rec.rows_waiting == 0
    rec.publish_soon(make_sample(MAX_SOON_ROWS), drain=False)
    rec.emit("hint", MAX_SOON_ROWS, {})
    assert [getattr(r, "event", r.step) for r in got[-2:]] == [MAX_SOON_ROWS, "hint"]
    rec.close()
