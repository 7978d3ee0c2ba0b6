"""Cost of memtop's memory reads inside a live training run (not an idle process).

glibc's mallinfo2() walks every arena's free lists, so its cost depends on the heap it finds:
~0.4 µs in a fresh process, ~10 µs after training, far more mid-step. This times the two reads
the trainer makes each step (mid-step peak read, end-of-step read) as they happen.

    python benchmarks/sampler_in_run.py [--steps 150]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time

from common import append_results, in_thread, machine

import probes.counters.memory as memory
from probes.runfolder import create_run_dir
from trainer.config import TrainConfig
from trainer.loop import Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    times: dict[str, list[float]] = {"observe_peak": [], "read": []}
    probe_cls = memory.MemoryProbe
    originals = {name: getattr(probe_cls, name) for name in times}

    def timed(name):
        def call(self, *a):
            t0 = time.perf_counter()
            value = originals[name](self, *a)
            times[name].append((time.perf_counter() - t0) * 1e6)
            return value
        return call

    for name in times:  # wrap the real methods with a stopwatch, for this process only
        setattr(probe_cls, name, timed(name))
    with tempfile.TemporaryDirectory() as tmp:
        cfg = dataclasses.replace(TrainConfig(device="cpu", run_dir=tmp), steps=args.steps)
        in_thread(Trainer(cfg, create_run_dir(tmp)).run)
    for name, fn in originals.items():
        setattr(probe_cls, name, fn)
    rows = []
    for name, values in times.items():
        v = sorted(values[10:])
        rows.append((name, statistics.median(v), v[int(len(v) * 0.95)], v[-1]))
    total = sum(r[1] for r in rows)
    table = "| read | median µs | p95 µs | max µs |\n|---|---|---|---|\n" + "\n".join(
        f"| MemoryProbe.{n} | {m:.1f} | {p:.1f} | {x:.1f} |" for n, m, p, x in rows)
    verdict = (f"Both reads together: {total:.0f} µs per step, inside a live run (target for the "
               f"whole per-step sample ≤ 20 µs: {'met' if total <= 20 else 'MISSED'}).")
    print(machine())
    print(table)
    print(verdict)
    if not args.no_append:
        append_results("Memory reads inside a live training run",
                       f"Default config, {args.steps} steps, first 10 dropped.\n"
                       f"Command: `python benchmarks/sampler_in_run.py --steps {args.steps}`\n\n"
                       f"{table}\n\n{verdict}")


if __name__ == "__main__":
    main()
