"""The Monitor's fixed cost per step: a 4×4 Linear trained plain and inside ``Monitor.step()``,
blocks of 50 steps interleaved, so what is left is memtop's own work per step (the step scope,
the memory reads, every instrument's per-step check, the metrics.jsonl row).

    python benchmarks/monitor_fixed_cost.py [--rounds 30] [--no-append] [--split]
    python benchmarks/monitor_fixed_cost.py --breakdown     # cProfile: where the step path goes

``--split`` (issue 26) adds a third side, a Monitor with ``step_split=False`` on a copy of the
model: monitored − that is what the step split's hooks and clocks cost per step.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import append_results, in_thread, median, quartiles

from probes import Monitor
from probes.counters.memory import heap_counters

BLOCK = 50


def one_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
             mon: Monitor | None) -> None:
    """One training step of the 4×4 Linear, plain (``mon`` None) or inside ``mon.step()``."""
    if mon is None:
        loss = model(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()
        return
    with mon.step() as s:
        loss = model(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        s.set(loss=loss)


def bare_hooks(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """The hooks the step split registers (probes/instruments/phases.py), each doing nothing but
    read the clock: what torch's hook calls cost, the floor under the split's own cost."""
    clock = time.perf_counter
    engine = torch.autograd.Variable._execution_engine
    queued = [False]

    def done() -> None:
        queued[0] = False
        clock()

    def grad_hook(param: Any) -> None:
        if not queued[0]:
            queued[0] = True
            engine.queue_callback(done)

    model.register_forward_pre_hook(lambda module, args: clock() and None)
    model.register_forward_hook(lambda module, args, out: clock() and None)
    for param in model.parameters():
        param.register_post_accumulate_grad_hook(grad_hook)
    opt.register_step_pre_hook(lambda *a: clock() and None)
    opt.register_step_post_hook(lambda *a: clock() and None)


def measure(rounds: int, split: bool = False) -> dict[str, list[float]]:
    torch.set_num_threads(1)  # a tiny model: thread hand-offs would dominate
    x = torch.randn(4, 4)
    out: dict[str, list[float]] = {"plain": [], "monitored": [], "heap_read": [], "no_split": [],
                                   "no_split_b": [], "plain_hooks": [], "empty": []}
    one = torch.tensor(1.0)
    with tempfile.TemporaryDirectory() as tmp:
        def side(monitor: bool = True, step_split: bool = True) -> tuple[Any, Any, Any]:
            model = torch.nn.Linear(4, 4)  # one Monitor per model
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            mon = Monitor(model, opt, samples_per_step=4, run_dir=tmp, write_report=False,
                          step_split=step_split) if monitor else None
            return model, opt, mon

        # --split: two step_split=False Monitors, each on its own model: their difference is
        # the A/A band of a comparison between two Monitors
        sides = {"plain": side(monitor=False), "monitored": side()}
        if split:
            sides["no_split"] = side(step_split=False)
            sides["no_split_b"] = side(step_split=False)
            sides["plain_hooks"] = side(monitor=False)
            bare_hooks(*sides["plain_hooks"][:2])

        def step(name: str) -> None:
            model, opt, mon = sides[name]
            one_step(model, opt, x, mon)

        names = list(sides)
        empty_mon = side()[2]  # a Monitor whose steps hold no torch work: its bookkeeping alone

        def empty_step() -> None:
            with empty_mon.step() as s:
                s.set(loss=one)

        for i in range(4 * BLOCK):  # warm every path
            step(names[i % len(names)])
            empty_step()
        for r in range(rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                t0 = time.perf_counter()
                for _ in range(BLOCK):
                    step(name)
                out[name].append((time.perf_counter() - t0) / BLOCK * 1e6)
            t0 = time.perf_counter()
            heap_counters()
            out["heap_read"].append((time.perf_counter() - t0) * 1e6)
            t0 = time.perf_counter()
            for _ in range(BLOCK):
                empty_step()
            out["empty"].append((time.perf_counter() - t0) / BLOCK * 1e6)
        for _model, _opt, mon in [*sides.values(), (None, None, empty_mon)]:
            if mon is not None:
                mon.close()
    return out


BREAKDOWN = ("scope.py:", "monitor.py:", "recorder.py:", "writer.py:", "memory.py:",
             "session.py:", "leak.py:", "leakwatch.py:", "hints.py:", "ledger.py:", "phases.py:",
             "host.py:", "forward_hook.py:", "stepvalues.py:", "profwindow.py:", "finder.py:",
             "phase_split.py:", "cudamem.py:",
             "guard.py:")


def breakdown(steps: int = 3000) -> str:
    """memtop's functions on the monitored step path, cumulative µs per step under cProfile
    (cProfile inflates every call: compare the rows with each other, not with the fixed cost)."""
    import cProfile
    import pstats

    torch.set_num_threads(1)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 4)
    with tempfile.TemporaryDirectory() as tmp:
        mon = Monitor(model, opt, samples_per_step=4, run_dir=tmp, write_report=False)

        for _ in range(300):
            one_step(model, opt, x, mon)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(steps):
            one_step(model, opt, x, mon)
        prof.disable()
        mon.close()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = []
    for (path, line, name), (_cc, ncalls, _tt, cum, _callers) in stats.items():
        where = f"{Path(path).name}:{line}"
        if any(where.startswith(b) for b in BREAKDOWN) and "/probes/" in path:
            rows.append((cum / steps * 1e6, f"{Path(path).parent.name}/{where}({name})",
                         ncalls / steps))
    rows.sort(reverse=True)
    lines = ["| function (cProfile, cumulative) | µs per step | calls per step |", "|---|---|---|"]
    lines += [f"| `{name}` | {us:.1f} | {calls:.2f} |" for us, name, calls in rows[:18]]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--no-append", action="store_true")
    ap.add_argument("--split", action="store_true",
                    help="also a Monitor with step_split=False: the split's own cost")
    ap.add_argument("--breakdown", action="store_true",
                    help="print where the step path's time goes (cProfile) and exit")
    args = ap.parse_args()
    if args.breakdown:
        print(in_thread(breakdown))
        return
    res = in_thread(measure, args.rounds, args.split)
    diffs = [m - p for m, p in zip(res["monitored"], res["plain"], strict=True)]
    body = (
        f"A 4×4 Linear + SGD, CPU, 1 thread; {args.rounds} rounds of {BLOCK} plain and {BLOCK} "
        f"monitored steps (order alternating), every instrument on, metrics.jsonl written. "
        f"The heap read is one mallinfo2 call on this small process's heap (a training process's "
        f"heap makes it slower: ~100–130 µs at memtop's default model).\n"
        f"Command: `python benchmarks/monitor_fixed_cost.py --rounds {args.rounds}`\n\n"
        f"| figure | median | min–max |\n|---|---|---|\n"
        f"| plain step | {median(res['plain']):.0f} µs | {min(res['plain']):.0f}–"
        f"{max(res['plain']):.0f} |\n"
        f"| monitored step | {median(res['monitored']):.0f} µs | {min(res['monitored']):.0f}–"
        f"{max(res['monitored']):.0f} |\n"
        f"| **Monitor's fixed cost per step** (monitored − plain, same round) | "
        f"**{median(diffs):.0f} µs** | {min(diffs):.0f}–{max(diffs):.0f} |\n"
        f"| one heap read (mallinfo2): once at the step's end on CPU, and after the forward "
        f"while it costs ≤ 1% of a step | "
        f"{median(res['heap_read']):.0f} µs | {min(res['heap_read']):.0f}–"
        f"{max(res['heap_read']):.0f} |\n"
        f"| a monitored step around no torch work (memtop's bookkeeping alone, its code warm) | "
        f"{median(res['empty']):.0f} µs | {min(res['empty']):.0f}–{max(res['empty']):.0f} |")
    if args.split:
        split = [m - n for m, n in zip(res["monitored"], res["no_split"], strict=True)]
        aa = [b - n for b, n in zip(res["no_split_b"], res["no_split"], strict=True)]
        body += (f"\n| monitored, step_split=False | {median(res['no_split']):.0f} µs | "
                 f"{min(res['no_split']):.0f}–{max(res['no_split']):.0f} |\n"
                 f"| **the step split's cost per step** (monitored − step_split=False, same "
                 f"round; target ≤ 10 µs) | **{median(split):.1f} µs** (IQR "
                 f"{quartiles(split)[0]:.1f}–{quartiles(split)[2]:.1f}) | "
                 f"{min(split):.0f}–{max(split):.0f} |\n"
                 f"| A/A: a second step_split=False Monitor − the first (same round) | "
                 f"{median(aa):.1f} µs (IQR {quartiles(aa)[0]:.1f}–{quartiles(aa)[2]:.1f}) "
                 f"| {min(aa):.0f}–{max(aa):.0f} |")
        floor = [h - p for h, p in zip(res["plain_hooks"], res["plain"], strict=True)]
        body += (f"\n| the floor: the split's hooks doing nothing but read the clock, on the "
                 f"plain loop (− plain) | {median(floor):.1f} µs (IQR {quartiles(floor)[0]:.1f}–"
                 f"{quartiles(floor)[2]:.1f}) | {min(floor):.0f}–{max(floor):.0f} |")
        body = body.replace("--rounds", "--split --rounds")
    print(body)
    if not args.no_append:
        append_results("Monitor's fixed cost per step", body)


if __name__ == "__main__":
    main()
