"""`memtop view`: time to open a 100,000-step run, and the CPU a viewer costs while following.

1. Open: a finished run folder with 100,000 step rows (written with memtop's own record writer,
   values shaped like a real run's) is opened with `memtop view` in a tmux pane, repeatedly; the
   figure is command start to "finished at step 100000" on screen (target ≤ 2 s), beside the
   in-process read of the same file (probes.runfolder.read_history).
2. Follow: a headless `memtop train --steps 0` writes a live run; `memtop view` follows it in a
   120x40 tmux pane; the viewer's CPU time (user + system from /proc) over a fixed interval, as a
   share of one core (target ≤ 2%), beside the tmux server's.

    python -m benchmarks run view_cost              # ~3 min
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import ROOT, Figure, met, proc_cpu_s, publish
from benchmarks.harness.terminal import TmuxPane, run_folder

OPEN_TARGET_S = 2.0
FOLLOW_TARGET = 0.02  # of one core


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    return proc_cpu_s(pid) or 0.0


def write_long_run(folder: Path, steps: int) -> None:
    """A finished run folder with ``steps`` step rows, through memtop's own writer."""
    from probes import records as R
    from probes.records import Event, StepSample
    from probes.runfolder import MetricsWriter, write_json

    folder.mkdir(parents=True)
    write_json(folder / "config.json", {"device": "cpu", "amp": "bf16", "batch_size": 16,
                                        "seq_len": 128, "layers": 4, "heads": 4, "dim": 128,
                                        "steps": steps, "warmup_steps": 5})
    writer = MetricsWriter(folder / "metrics.jsonl")
    writer.write(Event(R.RUN_STARTED, 0, 0.0, {"device": "cpu", "amp": "bf16",
                                               "params": 818_560}))
    for step in range(1, steps + 1):
        wobble = (step * 7919) % 1000
        writer.write(StepSample(
            step=step, time_s=step * 0.08, loss=2.5 - step / steps, tokens_per_s=24000.0 + wobble,
            step_ms=85.0 + wobble / 100, allocated_bytes=180_000_000 + wobble * 1000,
            reserved_bytes=220_000_000, peak_allocated_bytes=240_000_000,
            driver_used_bytes=600_000_000, host_rss_bytes=600_000_000, scale=None,
            skipped_steps=0, amp="bf16", device="cpu", grad_norm=1.0))
    writer.write(Event(R.RUN_FINISHED, steps, steps * 0.08, {"reason": "finished"}))
    writer.close()


def open_times(folder: Path, steps: int, repeats: int) -> list[float]:
    out = []
    for i in range(repeats):
        pane = TmuxPane(f"open{i}", 120, 40, [sys.executable, "-m", "tui.cli", "view",
                                              str(folder)])
        t0 = pane.started
        while time.perf_counter() - t0 < 60:
            if f"finished at step {steps}" in pane.capture():
                out.append(time.perf_counter() - t0)
                break
            time.sleep(0.02)
        else:
            raise RuntimeError("the viewer never showed the finished state:\n" + pane.capture())
        pane.send("q")
        pane.wait_dead(20)
        pane.kill()
    return out


def follow_cost(seconds: float) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="memtop-viewcost-"))
    writer = subprocess.Popen([sys.executable, "-m", "tui.cli", "train", "--headless",
                               "--steps", "0", "--log-every", "1000", "--run-dir", str(root)],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        run = run_folder(root)
        t0 = time.monotonic()  # the folder comes first; its files once torch has loaded
        while not ((run / "config.json").exists() and (run / "metrics.jsonl").exists()):
            if time.monotonic() - t0 > 120:
                raise RuntimeError(f"{run} never became a run folder")
            time.sleep(0.1)
        pane = TmuxPane("follow", 120, 40, [sys.executable, "-m", "tui.cli", "view", str(run)])
        t0 = time.monotonic()
        while "RUNNING" not in pane.capture():
            if time.monotonic() - t0 > 120:
                raise RuntimeError("the viewer never showed a running run:\n" + pane.capture())
            time.sleep(0.2)
        time.sleep(5)  # past start-up: the steady following cost
        server = TmuxPane.server_pid()
        v0, s0, w0, t_0 = cpu_s(pane.pid), cpu_s(server), cpu_s(writer.pid), time.monotonic()
        time.sleep(seconds)
        v1, s1, w1, t_1 = cpu_s(pane.pid), cpu_s(server), cpu_s(writer.pid), time.monotonic()
        pane.send("q")
        pane.wait_dead(20)
        pane.kill()
        wall = t_1 - t_0
        return {"viewer": (v1 - v0) / wall, "tmux": (s1 - s0) / wall,
                "writer": (w1 - w0) / wall, "wall_s": wall}
    finally:
        writer.send_signal(signal.SIGINT)
        writer.wait(60)


def options(ap) -> None:
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--follow-s", type=float, default=60.0)


def main(args) -> None:
    folder = Path(tempfile.mkdtemp(prefix="memtop-longrun-")) / "run"
    t0 = time.perf_counter()
    write_long_run(folder, args.steps)
    print(f"wrote {args.steps} steps in {time.perf_counter() - t0:.1f} s "
          f"({(folder / 'metrics.jsonl').stat().st_size / 1e6:.1f} MB)")
    from probes.runfolder import read_history

    reads = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        read_history(folder / "metrics.jsonl")
        reads.append(time.perf_counter() - t)
    opens = open_times(folder, args.steps, args.repeats)
    follow = follow_cost(args.follow_s)
    figures = [
        Figure("view_cost/open", f"`memtop view`: open a {args.steps:,}-step run (command → "
               "final state on screen)", f"≤ {OPEN_TARGET_S:g} s",
               f"{statistics.median(opens):.2f} s ({min(opens):.2f}–{max(opens):.2f}, "
               f"n={len(opens)})", met(statistics.median(opens), OPEN_TARGET_S)),
        Figure("view_cost/follow", "`memtop view`: viewer CPU while following a live run at "
               "120×40", f"≤ {FOLLOW_TARGET:.0%} of a core", f"{follow['viewer']:.1%} of a core "
               f"over {follow['wall_s']:.0f} s", met(follow["viewer"], FOLLOW_TARGET))]
    rows = [
        (figures[0].what, figures[0].value, figures[0].target, figures[0].status),
        ("  of which read_history (in process)",
         f"{statistics.median(reads):.2f} s ({min(reads):.2f}–{max(reads):.2f})", "", ""),
        (figures[1].what, figures[1].value, figures[1].target, figures[1].status),
        ("  tmux server (the terminal) meanwhile", f"{follow['tmux']:.1%}", "", ""),
        ("  the writer (headless trainer) meanwhile", f"{follow['writer']:.0%}", "", ""),
    ]
    table = "| figure | median (spread) | target | verdict |\n|---|---|---|---|\n" + "\n".join(
        f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows)
    publish(args, "memtop view: open time and following cost",
            f"Load average at the end {os.getloadavg()[0]:.1f}.\n\n{table}", figures)
