"""The Monitor's fixed cost per step: a 4×4 Linear trained plain and inside ``Monitor.step()``,
blocks of 50 steps interleaved, so what is left is memtop's own work per step (the step scope,
the memory reads, every instrument's per-step check, the metrics.jsonl row).

    python -m benchmarks run monitor_fixed_cost [--rounds 30] [--no-append] [--split]
    python -m benchmarks run monitor_fixed_cost --breakdown   # cProfile: where the step path goes

``--split`` (issue 26) adds a third side, a Monitor with ``step_split=False`` on a copy of the
model: monitored − that is what the step split's hooks and clocks cost per step.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import Figure, in_thread, median, met, publish, quartiles, spread
from probes import Monitor
from probes.counters.memory import heap_counters

BLOCK = 50
TARGET_US = 50.0  # the Monitor's fixed cost per step (issue 28)
SPLIT_TARGET_US = 10.0  # the step split's own cost (issue 26)


def one_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
             mon: Monitor | None) -> None:
    """One training step of the 4×4 Linear, plain (``mon`` None) or inside ``mon.step()``."""
    if mon is None:
        _sgd_step(model, opt, x).item()  # the plain loop reads its loss too
        return
    with mon.step() as s:
        s.set(loss=_sgd_step(model, opt, x))


def _sgd_step(model: torch.nn.Module, opt: torch.optim.Optimizer,
              x: torch.Tensor) -> torch.Tensor:
    loss = model(x).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


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


def options(ap) -> None:
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--split", action="store_true",
                    help="also a Monitor with step_split=False: the split's own cost")
    ap.add_argument("--breakdown", action="store_true",
                    help="print where the step path's time goes (cProfile) and exit")


def main(args) -> None:
    if args.breakdown:
        print(in_thread(breakdown))
        return
    res = in_thread(measure, args.rounds, args.split)
    diffs = [m - p for m, p in zip(res["monitored"], res["plain"], strict=True)]

    def line(what: str, values: list[float], fmt: str = "{:.0f} µs") -> str:
        return f"| {what} | {fmt.format(median(values))} | {min(values):.0f}–{max(values):.0f} |"

    rows = [
        line("plain step", res["plain"]), line("monitored step", res["monitored"]),
        line("**Monitor's fixed cost per step** (monitored − plain, same round)", diffs,
             "**{:.0f} µs**"),
        line("one heap read (mallinfo2): once at the step's end on CPU, and after the forward "
             "while it costs ≤ 1% of a step", res["heap_read"]),
        line("a monitored step around no torch work (memtop's bookkeeping alone, its code warm)",
             res["empty"])]
    figures = [
        Figure("monitor_fixed_cost/fixed", "the Monitor's fixed cost per step (4×4 Linear, "
               "monitored − plain)", f"≤ {TARGET_US:g} µs",
               spread(diffs, "{:.0f}", " µs", False), met(median(diffs), TARGET_US))]
    if args.split:
        split = [m - n for m, n in zip(res["monitored"], res["no_split"], strict=True)]
        aa = [b - n for b, n in zip(res["no_split_b"], res["no_split"], strict=True)]
        floor = [h - p for h, p in zip(res["plain_hooks"], res["plain"], strict=True)]
        iqr = "{:.1f} µs (IQR %.1f–%.1f)"
        rows += [
            line("monitored, step_split=False", res["no_split"]),
            line(f"**the step split's cost per step** (monitored − step_split=False, same "
                 f"round; target ≤ {SPLIT_TARGET_US:g} µs)", split,
                 "**" + iqr % (quartiles(split)[0], quartiles(split)[2]) + "**"),
            line("A/A: a second step_split=False Monitor − the first (same round)", aa,
                 iqr % (quartiles(aa)[0], quartiles(aa)[2])),
            line("the floor: the split's hooks doing nothing but read the clock, on the plain "
                 "loop (− plain)", floor, iqr % (quartiles(floor)[0], quartiles(floor)[2]))]
        figures.append(Figure("monitor_fixed_cost/split", "the step split's own cost per step "
                              "(monitored − step_split=False)", f"≤ {SPLIT_TARGET_US:g} µs",
                              spread(split, "{:.1f}", " µs", False),
                              met(median(split), SPLIT_TARGET_US)))
    body = (
        f"A 4×4 Linear + SGD, CPU, 1 thread; {args.rounds} rounds of {BLOCK} plain and {BLOCK} "
        f"monitored steps (order alternating), every instrument on, metrics.jsonl written. "
        f"The heap read is one mallinfo2 call on this small process's heap (a training process's "
        f"heap makes it slower: ~100–130 µs at memtop's default model).\n\n"
        f"| figure | median | min–max |\n|---|---|---|\n" + "\n".join(rows))
    publish(args, "Monitor's fixed cost per step", body, figures)
