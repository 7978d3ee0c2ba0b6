"""The Monitor's fixed cost per step: a 4×4 Linear trained plain and inside ``Monitor.step()``,
blocks of 50 steps interleaved, so what is left is memtop's own work per step (the step scope,
the memory reads, every instrument's per-step check, the metrics.jsonl row).

    python benchmarks/monitor_fixed_cost.py [--rounds 30] [--no-append] [--split]

``--split`` (issue 26) adds a third side, a Monitor with ``step_split=False`` on a copy of the
model: monitored − that is what the step split's hooks and clocks cost per step.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from common import append_results, in_thread, median

from probes import Monitor
from probes.counters.memory import heap_counters

BLOCK = 50


def measure(rounds: int, split: bool = False) -> dict[str, list[float]]:
    torch.set_num_threads(1)  # a tiny model: thread hand-offs would dominate
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 4)
    out: dict[str, list[float]] = {"plain": [], "monitored": [], "heap_read": [], "no_split": []}
    model2 = torch.nn.Linear(4, 4)  # the --split side's own model: one Monitor per model
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.01)
    with tempfile.TemporaryDirectory() as tmp:
        mon = Monitor(model, opt, samples_per_step=4, run_dir=tmp, write_report=False)
        mon2 = Monitor(model2, opt2, samples_per_step=4, run_dir=tmp, write_report=False,
                       step_split=False) if split else None

        def step(monitored: bool | str) -> None:
            if monitored == "no_split" and mon2 is not None:
                with mon2.step() as s:
                    loss = model2(x).sum()
                    loss.backward()
                    opt2.step()
                    opt2.zero_grad()
                    s.set(loss=loss)
            elif monitored:
                with mon.step() as s:
                    loss = model(x).sum()
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    s.set(loss=loss)
            else:
                loss = model(x).sum()
                loss.backward()
                opt.step()
                opt.zero_grad()
                loss.item()

        sides: tuple[bool | str, ...] = (False, True, "no_split") if split else (False, True)
        for i in range(4 * BLOCK):  # warm every path
            step(sides[i % len(sides)])
        for r in range(rounds):
            for monitored in (sides if r % 2 == 0 else sides[::-1]):
                t0 = time.perf_counter()
                for _ in range(BLOCK):
                    step(monitored)
                key = monitored if isinstance(monitored, str) else (
                    "monitored" if monitored else "plain")
                out[key].append((time.perf_counter() - t0) / BLOCK * 1e6)
            t0 = time.perf_counter()
            heap_counters()
            out["heap_read"].append((time.perf_counter() - t0) * 1e6)
        mon.close()
        if mon2 is not None:
            mon2.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--no-append", action="store_true")
    ap.add_argument("--split", action="store_true",
                    help="also a Monitor with step_split=False: the split's own cost")
    args = ap.parse_args()
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
        f"| of which one heap read (mallinfo2), called twice per step on CPU | "
        f"{median(res['heap_read']):.0f} µs | {min(res['heap_read']):.0f}–"
        f"{max(res['heap_read']):.0f} |")
    if args.split:
        split = [m - n for m, n in zip(res["monitored"], res["no_split"], strict=True)]
        body += (f"\n| monitored, step_split=False | {median(res['no_split']):.0f} µs | "
                 f"{min(res['no_split']):.0f}–{max(res['no_split']):.0f} |\n"
                 f"| **the step split's cost per step** (monitored − step_split=False, same "
                 f"round) | **{median(split):.1f} µs** | {min(split):.0f}–{max(split):.0f} |")
        body = body.replace("--rounds", "--split --rounds")
    print(body)
    if not args.no_append:
        append_results("Monitor's fixed cost per step", body)


if __name__ == "__main__":
    main()
