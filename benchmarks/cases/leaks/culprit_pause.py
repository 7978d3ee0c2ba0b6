"""How long the culprit finder pauses the training thread, by live Python objects.

Real leaks (examples/leaky_loops.py: `logits` a tensor kept per step, `graph` losses kept with
their graphs, `cycles` gc off: a full DEBUG_SAVEALL collection) under probes.Monitor,
with ballast objects kept alive beside it (lists and small instances, all gc-tracked, as a
big program's heap is); the finder runs at the leak alert and its leak_culprit event says how
long its two looks took together (``look_s``: two heap censuses, the referrer walk, tracemalloc's
snapshots) and how many objects the census scanned. Target: at most 1 s at 10⁶ objects.

    python -m benchmarks run culprit_pause [--sizes 100000 1000000] [--repeats 3] [--loops ...]
        [--no-append]
"""

from __future__ import annotations

import gc
import json
import statistics
import tempfile
from pathlib import Path

from benchmarks.harness import BadInput, Figure, met, publish
from benchmarks.harness.examples import example

TARGET_S = 1.0


class Ballast:
    def __init__(self, i: int) -> None:
        self.i = i
        self.items = [i]


def ballast(n: int) -> list[object]:
    """About ``n`` gc-tracked objects: half instances (each with a list), half lists."""
    out: list[object] = []
    for i in range(n // 3):
        out.append(Ballast(i))
        out.append([i])
    return out


def one_run(loop: str, extra: int) -> tuple[float, int]:
    leaky_loops = example("leaky_loops")
    kept = ballast(extra)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = leaky_loops.train(loop, 24, tmp, listen=False, write_report=False,
                                    ledger=False, profiler=False)
        rows = [json.loads(line) for line in Path(run_dir, "metrics.jsonl").open()]
    found = [r for r in rows if r.get("event") == "leak_culprit"]
    del kept
    gc.collect()
    if not found or "look_s" not in found[0]:
        raise SystemExit(f"no culprit event in the run ({found})")
    return float(found[0]["look_s"]), int(found[0]["objects_scanned"])


def options(ap) -> None:
    leaky_loops = example("leaky_loops")
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--loops", nargs="+", default=["logits", "graph", "cycles"],
                    choices=[n for n in leaky_loops.LOOPS if n not in leaky_loops.HEALTHY])


def main(args) -> None:
    if args.repeats < 1 or any(n < 0 for n in args.sizes):
        raise BadInput("--repeats must be at least 1 and --sizes not negative")
    lines = ["| leak | ballast objects | objects scanned | both looks, median s | max s | target |",
             "|---|---:|---:|---:|---:|---|"]
    worst: dict[int, tuple[float, int]] = {}  # ballast -> (longest look, objects scanned)
    for loop, n in [(loop, n) for loop in args.loops for n in args.sizes]:
        runs = [one_run(loop, n) for _ in range(args.repeats)]
        looks = [r[0] for r in runs]
        scanned = statistics.median(r[1] for r in runs)
        lines.append(f"| {loop} | {n:,} | {int(scanned):,} | {statistics.median(looks):.3f} | "
                     f"{max(looks):.3f} | ≤ {TARGET_S:g} s: {met(max(looks), TARGET_S)} |")
        worst[n] = max(worst.get(n, (0.0, 0)), (max(looks), int(scanned)))
        print(lines[-1], flush=True)
    n = max(worst)
    look, scanned = worst[n]
    publish(args, "Issue #25: culprit finder pause",
            "\n".join(lines) + f"\n\n{args.repeats} run(s) per row.",
            [Figure("culprit_pause/largest", "the culprit finder's pause (both looks), worst leak "
                    f"of {', '.join(args.loops)}, at the largest ballast", f"≤ {TARGET_S:g} s at "
                    "10⁶ objects", f"{look:.3f} s at {scanned:,} objects scanned", met(look,
                                                                                     TARGET_S))])
