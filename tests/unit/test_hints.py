"""Live hints (the tutorial's pitfalls): each defined once in probes/records/hints.py, emitted once
a run. CPU runs show those that apply on CPU; the CUDA ones are checked on recorded samples."""

from __future__ import annotations

import dataclasses

import torch
from factories import in_thread, make_sample, metrics_rows

from probes import records as R
from probes.counters.host import cpu_flags
from probes.instruments.hints import (
    cpu_bf16_problem,
    low_precision_share,
    step_hints,
    tensor_core_problem,
)
from probes.monitor.monitor import Monitor

MiB = 1 << 20
CUDA_SAMPLE = make_sample(10, tokens_per_s=1e5, step_ms=3.0, allocated_bytes=400 * MiB,
                          reserved_bytes=2048 * MiB, peak_allocated_bytes=900 * MiB,
                          driver_used_bytes=2600 * MiB, host_rss_bytes=3000 * MiB,
                          scale=65536.0, amp="fp16", device="cuda:0", alloc_retries=0, ooms=0)


def test_every_hint_is_defined_once_with_text():
    names = [h.name for h in R.HINTS]
    assert len(names) == len(set(names)) == len(R.HINT_KINDS)
    assert all(h.devices in ("any", "cuda", "cpu") and h.title and h.why for h in R.HINTS)
    assert R.HINT in R.EVENT_KINDS


def test_cuda_hints_from_recorded_samples():
    got = dict(step_hints(CUDA_SAMPLE, synced=True, warmup=5))
    assert set(got) == {"cache_large"}
    got = dict(step_hints(dataclasses.replace(CUDA_SAMPLE, alloc_retries=3), True, 5))
    assert set(got) == {"alloc_retries"} and "3 retries" in got["alloc_retries"]
    got = dict(step_hints(dataclasses.replace(CUDA_SAMPLE, reserved_bytes=410 * MiB),
                          synced=False, warmup=5))
    assert set(got) == {"no_sync_boundary"}
    assert step_hints(dataclasses.replace(CUDA_SAMPLE, step=3), synced=False, warmup=5) == []
    timed = dataclasses.replace(CUDA_SAMPLE, reserved_bytes=410 * MiB, split_step=6)
    assert step_hints(timed, synced=False, warmup=5) == []  # the device's time: no pitfall
    cpu = dataclasses.replace(CUDA_SAMPLE, device="cpu")
    assert step_hints(cpu, synced=False, warmup=5) == []  # no CUDA hint on CPU


def test_tensor_core_and_dtype_checks():
    assert tensor_core_problem("fp16", (6, 1)) and tensor_core_problem("bf16", (7, 5))
    assert tensor_core_problem("fp16", (7, 0)) is None
    assert tensor_core_problem("off", (6, 0)) is None
    half = torch.nn.Linear(4, 4).half()
    assert low_precision_share(list(half.parameters())) == 1.0
    assert low_precision_share(list(torch.nn.Linear(4, 4).parameters())) == 0.0


def test_cpu_bf16_is_hinted_only_where_it_is_emulated():
    cpuinfo = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\nbogomips\t: 4000\n"
    flags = cpu_flags(cpuinfo)  # a recorded /proc/cpuinfo of an AVX2-only EPYC
    assert {"avx2", "fma"} <= flags
    assert "neither avx512_bf16 nor amx_bf16" in cpu_bf16_problem("bf16", flags)
    assert cpu_bf16_problem("off", flags) is None  # fp32: nothing emulated
    assert cpu_bf16_problem("bf16", flags | {"avx512f", "avx512_bf16"}) is None
    assert cpu_bf16_problem("bf16", flags | {"amx_bf16"}) is None
    assert cpu_bf16_problem("bf16", cpu_flags("model name: ?\n")) is None  # unknown: no guess


def _hints(run_dir):
    """The run's event rows, and the names of its hints in order."""
    _, events = metrics_rows(run_dir)
    return events, [e["hint"] for e in events if e["event"] == "hint"]


def _monitor(model, opt, tmp_path, **kw):
    return Monitor(model, opt, run_dir=tmp_path, listen=False, profiler=False,
                   leak_watch=False, ledger=False, write_report=False, warmup_steps=1, **kw)


def test_cpu_run_shows_scaler_hints_once(tmp_path):
    """A GradScaler fed inf gradients every step: the scale collapses below 1 and most steps
    are skipped; each hint is written exactly once."""

    def run():
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
        with _monitor(model, opt, tmp_path, scaler=scaler) as mon:
            for _ in range(25):
                with mon.step() as s:
                    loss = model(torch.ones(2, 8)).sum()
                    scaler.scale(loss).backward()
                    model.weight.grad[0, 0] = float("inf")
                    scaler.step(opt)
                    scaler.update()
                    opt.zero_grad(set_to_none=True)
                    s.set(loss=loss)
            return mon.run_dir

    events, hints = _hints(in_thread(run))
    assert sorted(hints) == ["many_skipped_steps", "scale_collapse"]
    ev = R.Event.from_json(next(e for e in events if e.get("hint") == "scale_collapse"))
    assert "fell below 1" in ev.summary()


def test_half_model_is_hinted_at_start(tmp_path):
    def run():
        model = torch.nn.Linear(8, 8).half()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with _monitor(model, opt, tmp_path) as mon:
            for _ in range(3):
                with mon.step() as s:
                    loss = model(torch.ones(2, 8, dtype=torch.float16)).float().sum()
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    s.set(loss=loss)
            return mon.run_dir

    _, hints = _hints(in_thread(run))
    assert hints == ["low_precision_params"]
