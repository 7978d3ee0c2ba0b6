"""What the dashboard keeps growing: tracemalloc diff of the UI process over a run with keys.

    python -m benchmarks run ui_growth [--seconds 120] [--warm 30] [--help-every 5] [--size 120x40]

MemtopApp.for_run on a tiny config in App.run_test (Textual's headless driver, the real widgets
and refresh), tracemalloc on (10 frames) from the first sample; --warm seconds later a
snapshot, then --seconds more with `?` pressed every --help-every s (open, then close), a second
snapshot. Prints
the allocation sites that grew most (traceback into memtop or Textual), the Footer's watcher
count and the number of gc-tracked objects that are not frozen. A smoke-level tool: it finds
what grows (it prints only: no row, no log), the memory_soak case measures how much RSS does.
"""

from __future__ import annotations

import asyncio
import gc
import tempfile
import time
import tracemalloc
from pathlib import Path

from probes.runfolder import create_run_dir
from trainer.config import TrainConfig
from tui.app import MemtopApp
from tui.widgets.footer import MemtopFooter

PUBLISHES = False  # finds sites; prints only
TINY = dict(device="cpu", layers=1, heads=2, dim=32, seq_len=16, block_size=32, batch_size=4)


def top_growth(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, n: int) -> list[str]:
    lines = []
    for stat in after.compare_to(before, "traceback")[:n]:
        frames = [f for f in stat.traceback if "/tracemalloc" not in f.filename]
        ours = [f for f in frames if "/tui/" in f.filename or "/probes/" in f.filename]
        where = " < ".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames[-3:][::-1])
        mine = f" [memtop: {Path(ours[-1].filename).name}:{ours[-1].lineno}]" if ours else ""
        lines.append(f"{stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks  "
                     f"{where}{mine}")
    return lines


async def run(args) -> None:
    size = tuple(int(v) for v in args.size.split("x"))
    tmp = tempfile.mkdtemp(prefix="memtop-growth-")
    config = TrainConfig(**TINY, steps=0, run_dir=tmp)
    app = MemtopApp.for_run(config, create_run_dir(Path(tmp)), deferred=True)
    async with app.run_test(size=size):
        t0 = time.monotonic()
        while app.last_sample is None and time.monotonic() - t0 < 900:
            await asyncio.sleep(0.5)  # torch imported, model built: tracing starts after that
        tracemalloc.start(10)
        await asyncio.sleep(args.warm)
        gc.collect()
        snap1, unfrozen1 = tracemalloc.take_snapshot(), len(gc.get_objects())
        footer = app.query_one(MemtopFooter)
        w1 = footer.compact_watchers()
        t0 = time.monotonic()
        presses = 0
        while time.monotonic() - t0 < args.seconds:
            if args.help_every > 0:  # what `?` does (Pilot times out on a busy machine)
                app.action_help()
                await asyncio.sleep(0.5)
                if app.screen is not app.screen_stack[0]:
                    app.screen.dismiss(None)
                presses += 1
                await asyncio.sleep(max(0.1, args.help_every - 0.5))
            else:
                await asyncio.sleep(1.0)
        gc.collect()
        snap2, unfrozen2 = tracemalloc.take_snapshot(), len(gc.get_objects())
        steps = app.last_sample.step if app.last_sample else 0
        w2 = footer.compact_watchers()
        app.request_quit("ui_growth done")
        await asyncio.sleep(1.0)
    app.shutdown(60)
    total = sum(s.size_diff for s in snap2.compare_to(snap1, "filename"))
    print(f"{args.seconds:.0f} s after {args.warm:.0f} s warm-up at {args.size}, {presses} help "
          f"open/close, up to step {steps}: traced memory {total / 2**20:+.2f} MiB; Footer "
          f"watchers {w1} -> {w2}; gc-tracked objects not frozen {unfrozen1:,} -> "
          f"{unfrozen2:,}")
    for line in top_growth(snap1, snap2, args.top):
        print(line)


def options(ap) -> None:
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--warm", type=float, default=30)
    ap.add_argument("--help-every", type=float, default=5, help="0: no key presses")
    ap.add_argument("--size", default="120x40")
    ap.add_argument("--top", type=int, default=12)


def main(args) -> None:
    asyncio.run(run(args))
