"""Cost of memtop's memory reads inside a live training run (not an idle process).

glibc's mallinfo2() walks every arena's free lists, so its cost depends on the heap it finds:
~0.4 µs in a fresh process, ~10 µs after training, far more mid-step. This times the two reads
the trainer makes each step (mid-step peak read, end-of-step read) as they happen.

    python -m benchmarks run sampler_in_run [--steps 150]
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time

import probes.counters.memory as memory
from benchmarks.harness import Figure, in_thread, met, publish
from probes.runfolder import create_run_dir
from trainer.config import TrainConfig
from trainer.loop import Trainer

TARGET_US = 20.0


def options(ap) -> None:
    ap.add_argument("--steps", type=int, default=150)


def main(args) -> None:
    times: dict[str, list[float]] = {"observe_peak": [], "read": []}
    probe_cls = memory.MemoryProbe
    originals = {name: getattr(probe_cls, name) for name in times}

    def timed(name):
        def call(self, *a, **kw):
            t0 = time.perf_counter()
            value = originals[name](self, *a, **kw)
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
        v = sorted(values[10:]) or [float("nan")]  # a read the run never made (its budget)
        rows.append((name, statistics.median(v), v[int(len(v) * 0.95)], v[-1]))
    total = sum(r[1] for r in rows)
    table = "| read | median µs | p95 µs | max µs |\n|---|---|---|---|\n" + "\n".join(
        f"| MemoryProbe.{n} | {m:.1f} | {p:.1f} | {x:.1f} |" for n, m, p, x in rows)
    verdict = met(total, TARGET_US)
    publish(args, "Memory reads inside a live training run",
            f"Default config, {args.steps} steps, first 10 dropped.\n\n{table}\n\nBoth reads "
            f"together: {total:.0f} µs per step, inside a live run (target for the whole "
            f"per-step sample ≤ {TARGET_US:g} µs: {verdict}).",
            [Figure("sampler_in_run/reads", "the two heap reads inside a live run (mid-step peak "
                    "+ end of step), medians summed", f"≤ {TARGET_US:g} µs", f"{total:.0f} µs",
                    verdict)], shown=table)
