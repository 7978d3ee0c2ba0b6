"""What a kill -9 takes from metrics.jsonl: a child publishes step rows through memtop's writer
(one every ~1 ms, the default 0.5 s flush interval) and is killed with SIGKILL at a random
moment; the rows published but not on disk, and the age of the newest row on disk, are counted.

    python -m benchmarks run kill9_loss [--kills 10] [--no-append]
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import ROOT, Figure, median, met, publish
from probes.runfolder.writer import FLUSH_INTERVAL_S

CHILD = """
import os, sys, time
sys.path.insert(0, {root!r})
from probes.runfolder import MetricsWriter
from probes.records import StepSample
writer = MetricsWriter({path!r})
step = 0
while True:
    step += 1
    writer.write(StepSample(step=step, time_s=time.monotonic(), loss=1.0, tokens_per_s=None,
                            step_ms=1.0, allocated_bytes=1, reserved_bytes=1,
                            peak_allocated_bytes=1, driver_used_bytes=1, host_rss_bytes=1,
                            scale=None, skipped_steps=0, amp="off", device="cpu"))
    os.write(1, b"%d\\n" % step)
    time.sleep(0.001)
"""


def one_kill(tmp: Path, i: int) -> tuple[int, float]:
    """(rows lost, age in ms of the newest row on disk at the kill)."""
    path = tmp / f"m{i}.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", CHILD.format(root=str(ROOT), path=str(path))],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    time.sleep(1.0 + random.random())  # a random phase against the flusher's period
    killed_at = time.monotonic()
    os.kill(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate()
    published = max(int(x) for x in out.split())
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return published - len(rows), (killed_at - rows[-1]["time_s"]) * 1000.0


def options(ap) -> None:
    ap.add_argument("--kills", type=int, default=10)


def main(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        res = [one_kill(Path(tmp), i) for i in range(args.kills)]
    lost = [r[0] for r in res]
    age = [r[1] for r in res]
    limit_ms = FLUSH_INTERVAL_S * 1000
    body = (f"{args.kills} kills at random moments of a child publishing a step row every ~1 ms "
            f"(flush interval {FLUSH_INTERVAL_S} s).\n\n"
            f"| figure | median | max |\n|---|---|---|\n"
            f"| rows published but not on disk | {median(lost):.0f} | {max(lost)} |\n"
            f"| age of the newest row on disk at the kill | {median(age):.0f} ms | "
            f"{max(age):.0f} ms |")
    publish(args, "What a kill -9 loses (issue 28)", body, [Figure(
        "kill9_loss/age", "what a kill -9 loses: the age of the newest row on disk at the kill "
        "(max of the kills)", f"≤ the flush interval, {limit_ms:.0f} ms", f"{max(age):.0f} ms "
        f"(median {median(age):.0f}; rows lost median {median(lost):.0f}, max {max(lost)})",
        met(max(age), limit_ms))])
