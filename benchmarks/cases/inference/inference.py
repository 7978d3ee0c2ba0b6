"""`memtop infer --headless` on its defaults: wall time, the phases, the KV cache check.

    python -m benchmarks run inference [--amp auto off] [--repeats 1] [--no-append]

Each run is the real command in a subprocess (OMP_NUM_THREADS=1, as the suite runs). Reported
from its report.json: wall time of the whole command, TTFT and decode p50/p95, tokens/s per phase,
the largest KV measured-vs-formula difference, the cache's growth per position against the
formula and the allocator's growth over the same steps, and the cache-off baseline. The load
average is printed beside each run: the 2 cores here are shared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import ROOT, Figure, load_avg, met, publish

TARGET_S = 60.0  # the whole command


def one_run(amp: str, root: Path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    load = load_avg()
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "tui.cli", "infer", "--headless", "--device",
                          "cpu", "--amp", amp, "--run-dir", str(root)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=True)
    wall = time.perf_counter() - t0
    run = Path(next(line.split()[-1] for line in out.stdout.splitlines()
                    if line.startswith("memtop: run folder")))
    report = json.loads((run / "report.json").read_text())
    return {"amp": amp, "wall_s": wall, "load": load, "res": report["results"],
            "profiles": [w.get("phase") for w in report["profiles"] if w["status"] == "done"]}


def row(r: dict) -> str:
    res, base = r["res"], r["res"]["baseline"] or {}

    def f(v: float | None, fmt: str = ".1f") -> str:
        return "n/a" if v is None else format(v, fmt)

    kv, pred = res["kv_slope_bytes_per_position"], res["kv_bytes_per_position"]
    alloc = res["allocated_slope_bytes_per_position"]
    return (f"| {r['amp']} | {r['wall_s']:.1f} s | {r['load']} | {f(res['ttft_ms_p50'])} / "
            f"{f(res['ttft_ms_p95'])} | {f(res['decode_ms_p50'], '.2f')} / "
            f"{f(res['decode_ms_p95'], '.2f')} | {f(res['prefill_tokens_per_s'], '.0f')} | "
            f"{f(res['decode_tokens_per_s'], '.0f')} | {f(res['kv_error_max'] * 100, '.2f')}% | "
            f"{f(kv, '.0f')} / {pred} | {f(alloc, '.0f')} ({f((alloc / pred - 1) * 100, '+.1f')}%)"
            f" | {f(base.get('cached_ms_per_token_p50'), '.1f')} vs "
            f"{f(base.get('recompute_ms_per_token_p50'), '.1f')} ms "
            f"({f(base.get('speedup'))}x, same tokens {base.get('same_tokens')}) | "
            f"{', '.join(r['profiles'])} |")


def options(ap) -> None:
    ap.add_argument("--amp", nargs="+", default=["auto", "off"])
    ap.add_argument("--repeats", type=int, default=1)


def main(args) -> None:
    rows, walls = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for amp in args.amp:
                r = one_run(amp, Path(tmp))
                rows.append(row(r))
                walls.append((amp, r["wall_s"]))
                print(rows[-1], flush=True)
    body = "\n".join([
        "Each run: `memtop infer --headless --device cpu --amp AMP`, defaults B=8, prompt 64, 64 "
        "new tokens, 4 requests, 4 layers, dim 128; request 1 is the warm-up and left out; load "
        "average 1/5/15 min at the start.", "",
        "| amp | wall | load | TTFT p50 / p95 ms | decode p50 / p95 ms | prefill tok/s | "
        "decode tok/s | KV max diff | KV growth B/position (meas. / formula) | allocator growth "
        "B/position | cache vs recompute, per token | profiled phases |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|", *rows])
    worst = max(w for _, w in walls)
    publish(args, "Inference: memtop infer --headless on defaults", body, [Figure(
        "inference/wall", "`memtop infer --headless` on defaults, the whole command, by --amp",
        f"< {TARGET_S / 60:g} min", " / ".join(f"{w:.1f} s ({amp})" for amp, w in walls),
        met(worst, TARGET_S))])
