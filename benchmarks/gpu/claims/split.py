"""GPU claims about the step split (issue 26): on CUDA the phases are device time from CUDA
events read a step or more later without a sync, the NVML busy figures reach the step rows, and
the gpu_idle hint fires when the GPU waits on the host inside long steps.

The pure checks (``split_problems``) are tested on CPU rows in tests/unit/test_gpu_check.py,
labelled as stand-ins; what needs a device is only here."""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any

import torch

from benchmarks.gpu.device import free_device
from benchmarks.gpu.registry import Ctx, Outcome, claim
from probes.records import GPU_BUSY_FIELDS, SPLIT_FIELDS

STEPS = 16
LOADER_SLEEP_S = 0.02
MAX_LAG_STEPS = 4  # probes/instruments/phase_split.py MAX_PENDING: a split is read by then


def split_problems(rows: list[dict[str, Any]], warmup: int = 2) -> list[str]:
    """What is wrong with a run's split after ``warmup`` steps (empty: nothing): every row
    carries a split of an earlier or the same step, at most MAX_LAG_STEPS behind, with forward,
    backward and optimizer seen and the parts never negative."""
    out: list[str] = []
    for r in rows:
        if r["step"] <= warmup:
            continue
        split_step = r.get("split_step")
        if split_step is None:
            out.append(f"step {r['step']}: no split")
            continue
        if not r["step"] - MAX_LAG_STEPS <= split_step <= r["step"]:
            out.append(f"step {r['step']}: split of step {split_step}")
        for name in ("forward_ms", "backward_ms", "optimizer_ms", "other_ms"):
            value = r.get(name)
            if value is None or value < 0:
                out.append(f"step {r['step']}: {name} {value}")
    return out


def _loop(device: torch.device, *, loader_sleep_s: float = 0.0, host_work_s: float = 0.0,
          set_loss: bool = True, steps: int = STEPS) -> tuple[list[dict], list[str], list[float]]:
    """A user's loop on a 2-layer MLP (forward and backward of a few ms on any GPU) under
    probes.Monitor: its rows, its hints, and each step's host time around ``with``."""
    from probes import Monitor
    from probes.runfolder import METRICS, read_metrics

    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 4096)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(2048, 4096, device=device)
    host_ms: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        with Monitor(model, opt, run_dir=tmp, listen=False, profiler=False, leak_watch=False,
                     ledger=False, write_report=False, warmup_steps=1) as mon:
            for _ in range(steps):
                time.sleep(loader_sleep_s)
                t0 = time.perf_counter()
                with mon.step() as s:
                    time.sleep(host_work_s)  # host work inside the step: the GPU idles
                    loss = model(x).float().pow(2).mean()
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    if set_loss:
                        s.set(loss=loss)
                host_ms.append((time.perf_counter() - t0) * 1000)
            run_dir = mon.run_dir
        steps_rows, events, _bad = read_metrics(run_dir / METRICS)
        hints = [e["hint"] for e in events if e.get("event") == "hint"]
    del model, opt, x
    free_device()
    return steps_rows, hints, host_ms


@claim(group="split", needs_s=30)
def split_device_time(ctx: Ctx) -> Outcome:
    """on CUDA every step row carries the split (data wait, forward, backward, optimizer, other)
    of its own or an earlier step, read from CUDA events at most 4 steps later; a 20 ms host
    sleep before each step shows as ≥ 15 ms of data wait"""
    rows, hints, _ = _loop(ctx.torch_device, loader_sleep_s=LOADER_SLEEP_S)
    problems = split_problems(rows)
    waits = [r["data_wait_ms"] for r in rows[3:] if r.get("data_wait_ms") is not None]
    wait = statistics.median(waits) if waits else None
    lag = max((r["step"] - r["split_step"] for r in rows if r.get("split_step") is not None),
              default=None)
    medians = {n: statistics.median(v) for n in SPLIT_FIELDS
               if (v := [r[n] for r in rows[3:] if r.get(n) is not None])}
    ok = not problems and wait is not None and wait >= 15.0 and "input_bound" in hints
    return Outcome.check(ok, f"data wait median {wait} ms, lag ≤ {lag} steps, hints {hints}, "
                         f"problems {problems[:3]}", medians_ms=medians, max_lag_steps=lag,
                         problems=problems[:10])


@claim(group="split", needs_s=30)
def split_adds_no_sync(ctx: Ctx) -> Outcome:
    """with the split on and no loss read, a step's host time stays well under its device time
    (forward + backward + optimizer): the CUDA events are queried, never synchronised"""
    rows, _, host_ms = _loop(ctx.torch_device, set_loss=False)
    device_ms = [sum(r[n] for n in ("forward_ms", "backward_ms", "optimizer_ms"))
                 for r in rows[3:] if r.get("backward_ms") is not None]
    if not device_ms:
        return Outcome.check(False, "no split read on any step")
    host, dev = statistics.median(host_ms[3:]), statistics.median(device_ms)
    return Outcome.check(host < 0.5 * dev, f"host {host:.2f} ms per step vs device "
                         f"{dev:.2f} ms (the host ran ahead: no sync)",
                         host_step_ms=host, device_phases_ms=dev)


@claim(group="split", needs_s=30)
def step_ms_on_device_clock(ctx: Ctx) -> Outcome:
    """with no loss read (the host runs ahead, no sync), a row's step_ms is the device's time of
    the step its split names: at least its forward + backward + optimizer and within 10% of its
    span's parts, while the host's time per step is under half of it (issue 45: step time was
    host time)"""
    rows, _, host_ms = _loop(ctx.torch_device, set_loss=False)
    timed = [r for r in rows[3:] if r.get("split_step") is not None
             and r.get("backward_ms") is not None]
    if not timed:
        return Outcome.check(False, "no row with a split")
    parts = [sum(r[n] or 0.0 for n in SPLIT_FIELDS if n != "data_wait_ms") for r in timed]
    ratios = [r["step_ms"] / p for r, p in zip(timed, parts, strict=True) if p > 0]
    busy = [sum(r[n] for n in ("forward_ms", "backward_ms", "optimizer_ms")) for r in timed]
    step = statistics.median(r["step_ms"] for r in timed)
    host = statistics.median(host_ms[3:])
    ok = (all(0.9 <= x <= 1.1 for x in ratios) and step >= 0.99 * statistics.median(busy)
          and host < 0.5 * step)
    return Outcome.check(ok, f"step_ms median {step:.2f} ms (device), its parts' ratio "
                             f"{min(ratios):.3f}–{max(ratios):.3f}, forward + backward + "
                             f"optimizer {statistics.median(busy):.2f} ms, host {host:.2f} ms",
                         step_ms=step, host_step_ms=host)


@claim(group="split", needs_s=30)
def nvml_busy_in_rows(ctx: Ctx) -> Outcome:
    """step rows on CUDA carry NVML's busy figures (utilisation, memory bandwidth utilisation,
    power and its limit, SM clock, temperature) from the poller's latest reading; on a MIG slice
    utilisation is null and the rest remain"""
    rows, _, _ = _loop(ctx.torch_device, steps=40)
    last = rows[-1]
    seen = {n: last.get(n) for n in GPU_BUSY_FIELDS}
    missing = [n for n, v in seen.items() if v is None]
    if set(missing) <= {"gpu_util_pct", "mem_bw_util_pct"} and missing:
        return ctx.not_run("utilisation refused (a MIG slice or vGPU)", **seen)
    busy = [r["gpu_util_pct"] for r in rows if r.get("gpu_util_pct") is not None]
    return Outcome.check(not missing and max(busy) > 0, f"last row {seen}", **seen)


@claim(group="split", needs_s=40)
def gpu_idle_hint(ctx: Ctx) -> Outcome:
    """a loop whose steps hold 30 ms of host work around a short GPU step gets the gpu_idle hint
    once (NVML utilisation under 50% while steps take ≥ 10 ms)"""
    rows, hints, _ = _loop(ctx.torch_device, host_work_s=0.03, steps=40)
    util = [r["gpu_util_pct"] for r in rows if r.get("gpu_util_pct") is not None]
    if not util:
        return ctx.not_run("NVML utilisation not reported here (MIG slice or vGPU)")
    return Outcome.check(hints.count("gpu_idle") == 1, f"hints {hints}, utilisation "
                         f"median {statistics.median(util):.0f}%", hints=hints)
