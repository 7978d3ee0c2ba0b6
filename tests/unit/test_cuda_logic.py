"""The CUDA path's logic, tested on CPU with recorded data (no GPU here, no mocks of torch):
allocator stats from one nested dict, fragmentation, the memory guard, allocation history
opt-in, bf16 by capability, fused AdamW with a GradScaler."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from factories import DATA, events_named, in_thread

from probes.counters.cuda_stats import (
    CACHE_BYTES_HINT,
    driver_overhead_bytes,
    fragmentation,
    stats_from_nested,
)
from probes.counters.cudamem import failure_artifacts, history_kwargs, start_history, stop_history
from probes.counters.memory import MemoryProbe, guard_trip
from trainer.config import bf16_problem
from trainer.loop import use_fused_adamw

MiB = 1 << 20


def test_stats_from_one_nested_dict():
    stats = json.loads((DATA / "cuda_memory_stats.json").read_text())
    st = stats_from_nested(stats)
    assert st.allocated_bytes == 412 * MiB
    assert st.reserved_bytes == 2048 * MiB
    assert st.peak_allocated_bytes == 1650 * MiB
    assert st.peak_reserved_bytes == 2112 * MiB
    assert st.inactive_split_bytes == 96 * MiB
    assert (st.alloc_retries, st.ooms) == (2, 0)


def test_stats_missing_keys_read_as_none():
    st = stats_from_nested({})  # what torch returns before CUDA is initialised
    assert st.allocated_bytes is None and st.alloc_retries is None
    st = stats_from_nested({"allocated_bytes": {"all": {"current": True}}, "num_ooms": 1})
    assert st.allocated_bytes is None and st.ooms == 1


def test_fragmentation_figures_and_hints():
    stats = stats_from_nested(json.loads((DATA / "cuda_memory_stats.json").read_text()))
    frag = fragmentation(stats.allocated_bytes, stats.reserved_bytes, stats.inactive_split_bytes,
                         stats.alloc_retries, stats.ooms)
    assert frag.cached_free_bytes == (2048 - 412) * MiB
    assert frag.cached_ratio == pytest.approx((2048 - 412) / 412)
    assert "retried" in frag.hint and "expandable_segments:True" in frag.hint
    big = fragmentation(400 * MiB, 400 * MiB + CACHE_BYTES_HINT, alloc_retries=0)
    assert "reserved ≫ allocated" in big.hint and "expandable_segments" in big.hint
    small = fragmentation(4000 * MiB, 4100 * MiB, alloc_retries=0)
    assert small.hint is None and small.cached_free_bytes == 100 * MiB
    assert fragmentation(None, 5) is None


def test_driver_overhead_is_nvml_minus_reserved():
    assert driver_overhead_bytes(2600 * MiB, 2048 * MiB) == 552 * MiB
    assert driver_overhead_bytes(None, 1) is None
    assert driver_overhead_bytes(1, None) is None


def test_guard_watches_every_counter_with_its_growth():
    limit = 1000
    assert guard_trip({"peak": 900, "reserved": 800}, None, limit) is None
    # reserved grew 150 in one step: 950 + 150 would pass the limit
    assert guard_trip({"peak": 900, "reserved": 950}, {"peak": 900, "reserved": 800},
                      limit) == ("reserved", 950, 150)
    assert guard_trip({"peak": 1001, "reserved": None}, None, limit) == ("peak", 1001, 0)
    assert guard_trip({"peak": 10**9}, None, None) is None


def test_history_is_opt_in_with_python_stacks():
    kw = history_kwargs()
    assert kw["stacks"] == "python" and kw["max_entries"] > 0 and kw["enabled"] == "all"
    cpu = torch.device("cpu")
    assert start_history(cpu, wanted=False) == "off"
    assert start_history(cpu, wanted=True).startswith("off (allocation history exists only")
    stop_history("off")  # nothing to stop
    assert failure_artifacts(Path("."), cpu, "off") == {}


def test_run_started_records_history_state(tmp_path):
    from probes.monitor.monitor import Monitor

    def run():
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with Monitor(model, opt, run_dir=tmp_path, listen=False, profiler=False,
                     leak_watch=False, ledger=False, write_report=False,
                     memory_history=True) as mon:
            with mon.step() as s:
                loss = model(torch.ones(2, 4)).sum()
                loss.backward()
                opt.step()
                s.set(loss=loss)
            return mon.run_dir, s.sample

    run_dir, sample = in_thread(run)
    started = events_named(run_dir, "run_started")[0]
    assert started["memory_history"].startswith("off (allocation history exists only")
    assert sample.step_peak_allocated_bytes is not None
    assert sample.step_peak_allocated_bytes >= sample.allocated_bytes


def test_cpu_step_peak_starts_over_each_step():
    probe = MemoryProbe(torch.device("cpu"))

    def work():
        probe.begin_step()
        t = torch.empty(16 * MiB, dtype=torch.uint8)
        probe.observe_peak()
        del t
        first = probe.read()
        probe.begin_step()
        second = probe.read()
        return first, second

    first, second = in_thread(work)
    assert first.step_peak_allocated_bytes >= first.allocated_bytes + 15 * MiB
    assert second.step_peak_allocated_bytes < first.step_peak_allocated_bytes - 15 * MiB
    assert second.peak_allocated_bytes == first.peak_allocated_bytes  # the run's peak stays


def test_bf16_needs_compute_capability_8():
    assert bf16_problem((8, 0), "NVIDIA A100-SXM4-80GB") is None
    assert bf16_problem((9, 0), "NVIDIA H200") is None
    msg = bf16_problem((7, 5), "Tesla T4")
    assert "Tesla T4" in msg and "7.5" in msg and "--amp fp16" in msg


def test_fused_adamw_skips_inf_steps_inside_its_kernel():
    """The path memtop's trainer takes on CUDA, run on CPU (fused AdamW has a CPU kernel):
    GradScaler hands found_inf to the optimizer instead of reading it with .item(), and the
    step with an inf gradient leaves the weights untouched while the scale backs off."""
    assert use_fused_adamw(torch.device("cuda:1")) and not use_fused_adamw(torch.device("cpu"))

    def run():
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
        assert getattr(opt, "_step_supports_amp_scaling", False)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        out = []
        for bad in (False, True, False):
            before = model.weight.detach().clone()
            loss = model(torch.ones(4, 8)).sum()
            scaler.scale(loss).backward()
            if bad:
                model.weight.grad[0, 0] = float("inf")
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            out.append((torch.equal(before, model.weight.detach()), scaler.get_scale()))
        return out

    (same0, s0), (same1, s1), (same2, s2) = in_thread(run)
    assert not same0 and same1 and not same2
    assert s1 == s0 / 2  # backed off on the skipped step


def test_snapshot_request_on_cpu_is_answered_not_crashed(tmp_path):
    from probes.control.requests import Request
    from probes.counters.cudamem import dump_snapshot
    from probes.monitor.monitor import Monitor

    assert "CUDA" in dump_snapshot(tmp_path, torch.device("cpu"), 3)["error"]

    def run():
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with Monitor(model, opt, run_dir=tmp_path, listen=False, profiler=False,
                     leak_watch=False, ledger=False, write_report=False) as mon:
            assert "memory_snapshot" not in mon.session.capabilities()
            for i in range(3):
                if i == 1:
                    mon.control.submit(Request("memory_snapshot"))
                with mon.step() as s:
                    loss = model(torch.ones(2, 4)).sum()
                    loss.backward()
                    opt.step()
                    s.set(loss=loss)
            return mon.run_dir

    run_dir = in_thread(run)
    snap = events_named(run_dir, "memory_snapshot")
    assert len(snap) == 1 and "only for CUDA" in snap[0]["error"]
    assert not list(run_dir.glob("cuda_memory_snapshot*"))
