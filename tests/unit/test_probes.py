"""Probes: each counter's semantics on CPU, units, the ring, the metrics file, NVML degrading."""

from __future__ import annotations

import json
import math

import pytest
import torch
from factories import in_thread, make_sample

from probes.counters.memory import MemoryProbe, RssReader, heap_counters
from probes.counters.nvml import NvmlPoller
from probes.records import STEP_FIELDS, Event, StepSample
from probes.runfolder import MetricsWriter, create_run_dir, read_metrics
from probes.tools.ring import Ring
from probes.tools.units import format_bytes, format_rate, parse_size

MiB = 1024 * 1024


def test_heap_counter_moves_by_the_size_of_a_tensor():
    probe = MemoryProbe(torch.device("cpu"))

    def work():
        before = probe.read()
        t = torch.empty(32 * MiB, dtype=torch.uint8)
        during = probe.read()
        del t
        after = probe.read()
        return before, during, after

    before, during, after = in_thread(work)
    grown = during.allocated_bytes - before.allocated_bytes
    # Byte-exact heap accounting, give or take what other threads of this process (pytest-xdist's
    # channel thread) malloc or free between the two reads: CI once saw 32 MiB - 2.5 KiB.
    assert abs(grown - 32 * MiB) < 256 * 1024
    assert during.reserved_bytes >= during.allocated_bytes
    assert after.allocated_bytes < during.allocated_bytes - 31 * MiB
    assert during.peak_allocated_bytes >= during.allocated_bytes


def test_rss_grows_when_pages_are_touched():
    rss = RssReader()

    def work():
        before = rss.read()
        t = torch.ones(64 * MiB, dtype=torch.uint8)  # ones touches every page
        after = rss.read()
        del t
        return before, after

    before, after = in_thread(work)
    assert after - before >= 60 * MiB


def test_cpu_peak_is_reset_and_tracks_the_sampled_max():
    probe = MemoryProbe(torch.device("cpu"))

    def work():
        t = torch.empty(16 * MiB, dtype=torch.uint8)
        probe.observe_peak()
        del t
        high = probe.read().peak_allocated_bytes
        probe.reset_peak()
        low = probe.read()
        return high, low

    high, low = in_thread(work)
    assert high >= low.allocated_bytes + 15 * MiB
    assert low.peak_allocated_bytes == low.allocated_bytes


def test_the_mid_step_heap_read_is_skipped_where_it_costs_over_its_budget():
    """A step shorter than 100 heap reads: the mid-step read is left out (issue 28), but taken
    on the first steps (after a reset) and every MID_STEP_EVERY-th step, so a costly heap still
    shows its forward peak."""
    from probes.counters.memory import MID_STEP_EVERY, MID_STEP_FIRST

    probe = MemoryProbe(torch.device("cpu"))

    def work():
        peaks = []
        for _ in range(MID_STEP_EVERY):
            probe.begin_step()
            t = torch.empty(16 * MiB, dtype=torch.uint8)
            probe.observe_peak(budgeted=True)
            del t
            r = probe.read()  # a step of microseconds: one heap read is over 1% of it
            peaks.append(r.step_peak_allocated_bytes - r.allocated_bytes)
        return peaks

    peaks = in_thread(work)
    first = MID_STEP_FIRST  # the first steps after a reset: a run's peak has its forward peak
    assert all(p >= 15 * MiB for p in peaks[:first]) and peaks[-1] >= 15 * MiB  # and step 16
    assert all(p < 15 * MiB for p in peaks[first:-1])
    assert probe.mid_step_reads == first + 1
    assert probe.mid_step_skipped == MID_STEP_EVERY - first - 1
    probe.observe_peak()  # a read the caller asks for is always taken
    assert probe.mid_step_reads == first + 2


def test_the_heap_read_is_spread_over_steps_only_where_it_costs_over_its_budget():
    """A fragmented heap (a leak's): mallinfo2 walks every free chunk, ~30 ms a read on the
    graph demo's 5 ms step; a healthy heap's read (1-100 µs) is always taken."""
    from probes.counters.memory import HEAP_READ_MAX_EVERY, heap_read_every

    assert heap_read_every(100e-6, 0.005) == 1  # under the floor: every step
    assert heap_read_every(3e-3, 1.0) == 1  # 0.3% of a 1 s step
    assert heap_read_every(3e-3, 0.1) == 2  # over the 2 ms floor and 1% of a 100 ms step
    assert heap_read_every(30e-3, 0.005) == 15  # the graph demo: 2 ms a step, not 30
    assert heap_read_every(1.0, 0.005) == HEAP_READ_MAX_EVERY  # a row at least every 16 steps


def test_a_spread_heap_read_repeats_the_last_reading_and_says_so(monkeypatch):
    """With no floor, a step of microseconds makes any heap read over its budget: the rows
    between two reads repeat the last one (heap_fresh False), never older than
    HEAP_READ_MAX_EVERY steps, and take no mid-step read."""
    from probes.counters import memory

    monkeypatch.setattr(memory, "HEAP_READ_FLOOR_S", 0.0)
    probe = MemoryProbe(torch.device("cpu"))

    def work():
        readings = []
        for _ in range(4 * memory.HEAP_READ_MAX_EVERY):
            probe.begin_step()
            probe.observe_peak(budgeted=True)
            readings.append(probe.read())
        return readings

    readings = in_thread(work)
    fresh_at = [i for i, r in enumerate(readings) if r.heap_fresh]
    assert fresh_at[0] == 0 and len(fresh_at) < len(readings)
    ends = [*fresh_at[1:], len(readings)]
    assert max(b - a for a, b in zip(fresh_at, ends, strict=True)) <= memory.HEAP_READ_MAX_EVERY
    last = None
    for r in readings:
        if r.heap_fresh:
            last = r
        else:
            assert (r.allocated_bytes, r.reserved_bytes) == \
                (last.allocated_bytes, last.reserved_bytes)
    assert probe.heap_reads_skipped == len(readings) - len(fresh_at)
    assert probe.mid_step_skipped >= len(readings) - len(fresh_at) - memory.MID_STEP_FIRST


def test_a_row_that_repeats_a_heap_read_names_the_step_it_repeats(monkeypatch, tmp_path):
    """A Monitor loop whose heap read is spread (no floor): each row either read the heap
    itself (heap_read_step null) or names the earlier step whose reading it repeats, in
    metrics.jsonl, so a flat stretch of allocated is not taken for a measured one."""
    from probes import Monitor
    from probes.counters import memory

    monkeypatch.setattr(memory, "HEAP_READ_FLOOR_S", 0.0)

    def loop():
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with Monitor(model, opt, run_dir=tmp_path, write_report=False) as mon:
            for _ in range(4 * memory.HEAP_READ_MAX_EVERY):
                with mon.step() as s:
                    loss = model(torch.randn(2, 4)).sum()
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    s.set(loss=loss)
        return mon.run_dir

    rows, _events, bad = read_metrics(in_thread(loop) / "metrics.jsonl")
    assert bad == 0  # the field keeps the schema's rules (records/step.py step_row_problem)
    steps = [StepSample.from_json(r) for r in rows]
    by_step = {r.step: r for r in steps}
    repeats = [r for r in steps if r.heap_read_step is not None]
    assert repeats and len(repeats) < len(steps)
    for row in repeats:
        read = by_step[row.heap_read_step]
        assert read.heap_read_step is None and row.step - memory.HEAP_READ_MAX_EVERY <= \
            read.step < row.step
        assert (row.allocated_bytes, row.reserved_bytes) == \
            (read.allocated_bytes, read.reserved_bytes)


def test_heap_counters_are_available_on_glibc():
    in_use, held = heap_counters()
    assert 0 < in_use <= held + 1  # in use never exceeds what malloc holds


@pytest.mark.parametrize("text,expected", [
    ("6GiB", 6 * 1024**3), ("512MiB", 512 * MiB), ("1.5GB", 1_500_000_000), ("4096", 4096),
    ("2 kib", 2048),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "six", "5XB", "-1GiB", "0"])
def test_parse_size_rejects_junk(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_format_helpers():
    assert format_bytes(None) == "n/a"
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(300 * MiB) == "300 MiB"
    assert format_bytes(-2 * MiB) == "-2.0 MiB"
    assert format_rate(12345) == "12.3k"
    assert format_rate(None) == "n/a"


def test_ring_is_bounded_and_counts_drops():
    ring: Ring[int] = Ring(maxlen=3)
    for i in range(5):
        ring.push(i)
    assert ring.drain() == [2, 3, 4]
    assert ring.dropped == 2
    assert ring.drain() == []


def test_metrics_file_is_valid_json_per_line_and_nan_becomes_null(tmp_path):
    run = create_run_dir(tmp_path)
    writer = MetricsWriter(run / "metrics.jsonl")
    writer.write(Event("run_started", 0, 0.0, {"amp": "bf16"}))
    writer.write(make_sample(1, loss=1.0))
    writer.write(make_sample(2, loss=math.nan))
    writer.write(Event("ledger", 2, 0.2, {"lines": {"a": [1.0, -math.inf]}}))
    writer.close()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert rows[0]["event"] == "run_started"
    assert set(rows[1]) == set(STEP_FIELDS)
    assert rows[1]["loss"] == 1.0
    assert rows[2]["loss"] is None
    assert rows[3]["lines"] == {"a": [1.0, None]}  # nested values too
    steps, events, bad = read_metrics(run / "metrics.jsonl")
    assert (len(steps), len(events), bad) == (2, 2, 0)


def test_read_metrics_skips_a_truncated_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
    steps, events, bad = read_metrics(path)
    assert [s["step"] for s in steps] == [1] and bad == 1


def test_run_dirs_are_never_reused(tmp_path):
    made = {create_run_dir(tmp_path) for _ in range(5)}
    assert len(made) == 5


def test_nvml_degrades_to_none_without_a_driver():
    poller = NvmlPoller(0)
    if poller.available:  # pragma: no cover - only on a GPU machine
        pytest.skip("NVML is present on this machine")
    assert poller.read_once() is None
    assert poller.error and "NVML" in poller.error
    poller.start()  # must be a no-op, not a crash
    poller.stop()


def test_ranks_agree_a_step_about_a_second_ahead_at_the_ranks_own_step_time(tmp_path):
    """A viewer that has read no row yet (no step time) asks the ranks' own: 20 ms steps give
    a lead of 50 steps, not the bare minimum of 3 (one rank once started a window late)."""
    from probes.control.ranks import agree_step
    from probes.control.requests import RunControl
    from probes.control.unix_socket import ControlServer
    from probes.runfolder import socket_name

    servers = []
    for rank, step in ((0, 40), (1, 41)):
        status = {"pid": 1, "rank": rank, "step": step, "paused": False, "step_ms": 20.0}
        server = ControlServer(tmp_path / socket_name(rank), RunControl(),
                               lambda status=status: status)
        assert server.start()
        servers.append(server)
    try:
        assert agree_step(tmp_path, [0, 1], None) == (41 + 50, None)
        assert agree_step(tmp_path, [0, 1], 10.0) == (41 + 100, None)  # the faster clock wins
    finally:
        for server in servers:
            server.close()


def test_of_two_ranks_killed_without_a_word_the_one_that_stopped_first_is_named():
    """rank 1 SIGKILLed at step 29; rank 0, stuck in the all-reduce, killed by torchrun after
    step 30: both end without a row, and rank 1 brought the run down (a CI run named rank 0)."""
    from probes.analysis.ranks import RankEnd, failed_rank

    survivor = RankEnd(0, 30, 30, None, None, None, 10, 0)
    killed = RankEnd(1, 29, 29, None, None, None, 11, 0)
    assert failed_rank([survivor, killed], {}).rank == 1
    assert failed_rank([RankEnd(0, 9, 9, None, None, None, 1, 0), killed], {}).rank == 0
