"""`memtop fit`: the prediction's error at 2×, 4× and 8× the probe's range, and the probe's own
time (issue 41; targets: errors within 10%, the whole `memtop fit` under 60 s on the default
model on 2 CPU cores).

    python benchmarks/fit_accuracy.py [--repeats 3] [--no-append]
    python benchmarks/fit_accuracy.py --smoke --no-append      # a tiny model, one repeat

The probe runs as `memtop fit` does (B = 1, 2, 4 at the model's T; T/4, T/2 at B = 4; no
refine point, so the errors are the fit's own reach), in a fresh process; each size checked runs
in its own fresh process (`python -m trainer.fitprobe`), so none carries the kernels another
cached. B goes to 2×, 4×, 8× the probe's largest B at T; T to 2×, 4×, 8× the probe's T at
B = 4, on the same model with a context (--block-size) of 8 × T. Errors are (predicted −
measured) / measured of the peak `memtop fit` fits against the budget (CPU: the process's RSS
high-water mark) and of the heap peak beside it; each a median over the repeats with its range.
Beside them the peak's error over the part a step adds above the rest level (the process's own
~400 MiB make the whole peak's error small): what the fit's step parts get wrong.
The probe's time is `memtop fit`'s wall time, torch's import included, a median with its range.
Timing needs a quiet machine: other processes on the 2 cores stretch it (--max-busy waits).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, busy_cores, publish

from probes.analysis.fit import fit_points, predict, probe_grid
from trainer.config import TrainConfig

REACH = (2, 4, 8)
SMOKE = {"layers": 1, "heads": 2, "dim": 32, "seq_len": 32, "batch_size": 4}


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def measure(config: TrainConfig, points: list[tuple[int, int]]) -> list[dict]:
    """The points in one fresh process: the probe's way (trainer/fitprobe.py)."""
    folder = Path(tempfile.mkdtemp(prefix="memtop-fit-bench-"))
    cfg = json.dumps(config.to_json())
    cmd = [sys.executable, "-m", "trainer.fitprobe", "--run-folder", str(folder), "--config",
           cfg, "--points", ",".join(f"{b}x{t}" for b, t in points), "--steps", "2"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=ROOT,
                          timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"fitprobe failed ({done.returncode}): {done.stderr[-2000:]}")
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("event") == "fit_point"]


def probe_seconds(options: dict) -> float:
    """`memtop fit`'s wall time as a user runs it (torch's import included; the default
    budget, the RAM still available, so its refine point too)."""
    args = [sys.executable, "-m", "tui.cli", "fit", "--run-dir",
            tempfile.mkdtemp(prefix="memtop-fit-bench-")]
    for key, value in options.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    t0 = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=_env(), cwd=ROOT,
                          timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"memtop fit failed: {done.stdout[-1000:]}{done.stderr[-1000:]}")
    return time.perf_counter() - t0


def _band(values: list[float], pct: bool = True) -> str:
    import statistics

    med = statistics.median(values)
    fmt = (lambda v: f"{v:+.1%}") if pct else (lambda v: f"{v:.1f}")
    return f"{fmt(med)} ({fmt(min(values))} – {fmt(max(values))})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="a tiny model, one repeat")
    parser.add_argument("--amp", default="auto", help="the models' --amp (auto: bf16 on a CPU "
                                                      "with native bf16, fp32 elsewhere)")
    parser.add_argument("--max-busy", type=float, default=0.5,
                        help="wait until other processes use fewer cores than this")
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    repeats = 1 if args.smoke else args.repeats
    options = dict(SMOKE if args.smoke else {}, device="cpu", amp=args.amp)
    base = TrainConfig.from_options(options, steps=0, warmup_steps=0, save_weights=False)
    t0 = base.seq_len
    wide = TrainConfig.from_options(dict(options, block_size=8 * t0), steps=0, warmup_steps=0,
                                    save_weights=False)
    busy = busy_cores(2.0)
    if busy > args.max_busy and not args.smoke:
        print(f"other processes use {busy:.1f} cores: the probe's time will be stretched")
    grid = probe_grid(base.batch_size, t0, "both")
    b_max = max(b for b, _ in grid)
    targets = [("B", r, wide, (b_max * r, t0)) for r in REACH] + \
              [("T", r, wide, (b_max, t0 * r)) for r in REACH]
    errors: dict[tuple[str, int], dict[str, list[float]]] = {}
    seconds: list[float] = []
    for _ in range(repeats):
        seconds.append(probe_seconds(options))
        fit = fit_points(measure(wide, grid), "cpu")
        for axis, reach, cfg, (b, t) in targets:
            (got,) = measure(cfg, [(b, t)])
            want = predict(fit, b, t)
            e = errors.setdefault((axis, reach), {"peak": [], "heap": [], "step": []})
            e["peak"].append((want["peak_bytes"] - got["peak_bytes"]) / got["peak_bytes"])
            rest = sum(p["bytes"] for p in fit["parts"] if "bytes" in p)  # what a step adds
            e["step"].append((want["peak_bytes"] - got["peak_bytes"])
                             / max(1, got["peak_bytes"] - rest))
            e["heap"].append((want["counter_peak_bytes"] - got["counter_peak_bytes"])
                             / got["counter_peak_bytes"])
    rows = ["| reach | size | peak (RSS) error | heap peak error | target | the step's part |",
            "|---|---|---|---|---|---|"]
    for axis, reach, _, (b, t) in targets:
        e = errors[(axis, reach)]
        rows.append(f"| {reach}× in {axis} | B={b} T={t} | {_band(e['peak'])} | "
                    f"{_band(e['heap'])} | within ±10% | {_band(e['step'])} |")
    body = "\n".join([
        f"Command: `python benchmarks/fit_accuracy.py{' --smoke' if args.smoke else ''} "
        f"--repeats {repeats}`; model {json.dumps(options)}, probe {grid}, no refine point; "
        f"T sizes on --block-size {8 * t0}; other processes used {busy:.1f} cores at the start.",
        "", *rows, "",
        f"`memtop fit`'s wall time (torch's import included): {_band(seconds, pct=False)} s "
        f"over {repeats} run(s); target < 60 s on 2 cores."])
    publish("Issue 41: memtop fit's reach and time" + (" (smoke)" if args.smoke else ""), body,
            append=not args.no_append)


if __name__ == "__main__":
    main()
