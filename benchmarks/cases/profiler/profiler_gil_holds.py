"""How long the profiler window's two C++ calls hold the GIL: the schedule's stop (inside the
last ``prof.step()``) and ``export_chrome_trace``, for memtop's default model and window.

A thread ticking every 1 ms stands in for the UI thread: its longest gap during each call is
how long a Python thread waited. memtop's window (probes/instruments/profwindow.py) puts a
GIL_BREATH_S sleep between the two, so the UI's longest wait is the longer call, not their sum
(issue 28). Run: python -m benchmarks run profiler_gil_holds --windows 7
"""

from __future__ import annotations

import os
import tempfile
import threading
import time

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from benchmarks.harness import Figure, median, met, publish, quartiles
from trainer.model import GPT, GPTConfig

TARGET_MS = 100.0  # the UI's stall budget (the ui_latency case)


def options(ap) -> None:
    ap.add_argument("--windows", type=int, default=7)


def main(args) -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig())
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    x = torch.randint(0, 256, (16, 128))  # (B, T): memtop train's defaults
    gaps: list[tuple[float, float]] = []
    done = threading.Event()

    def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append((now - last, now))
            last = now

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def longest_wait_ms(t0: float, t1: float) -> float:
        return 1e3 * max((g for g, w in gaps if t0 <= w <= t1 + 0.003), default=0.0)

    threading.Thread(target=ticker, daemon=True).start()
    stops, exports, both = [], [], []
    for _ in range(args.windows):
        prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                       schedule=schedule(wait=1, warmup=1, active=3, repeat=1))
        prof.start()
        for _ in range(5):
            step()
            t0 = time.perf_counter()
            prof.step()
            t1 = time.perf_counter()
        prof.stop()
        with tempfile.TemporaryDirectory() as tmp:
            t2 = time.perf_counter()
            prof.export_chrome_trace(os.path.join(tmp, "trace.json"))
            t3 = time.perf_counter()
        time.sleep(0.05)
        stops.append(longest_wait_ms(t0, t1))
        exports.append(longest_wait_ms(t2, t3))
        both.append(1e3 * (t1 - t0) + 1e3 * (t3 - t2))
    done.set()

    def fmt(v: list[float]) -> str:
        lo, _, hi = quartiles(v)
        return f"{median(v):.0f} ms (IQR {lo:.0f}–{hi:.0f})"

    body = "\n".join([
        "Default GPT, B=16 T=128, bf16 autocast, window wait/warmup/active 1/1/3, "
        f"profile_memory on; {args.windows} windows.", "",
        "| call | longest wait of a Python thread (median, IQR) |", "|---|---|",
        f"| the schedule's stop (last prof.step()) | {fmt(stops)} |",
        f"| export_chrome_trace | {fmt(exports)} |",
        f"| both back to back (what the UI waited before the breath) | {fmt(both)} |"])
    longer = max(median(stops), median(exports))
    publish(args, "Issue 28: the profiler window's GIL holds", body, [Figure(
        "profiler_gil_holds/longer", "the longer of the profiler window's two GIL holds (the "
        "schedule's stop, the trace export): what the UI waits", f"≤ {TARGET_MS:g} ms",
        f"stop {fmt(stops)}; export {fmt(exports)}", met(longer, TARGET_MS))])
