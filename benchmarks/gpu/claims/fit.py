"""GPU claims about `memtop fit` on CUDA (issue 41): an OOM inside the probe is a point that
does not fit (the allocator emptied, the probe goes on, no error row); the fit predicts the
peak reserved at 4x and 8x its probe's largest B; --verify's largest B runs and the first B over
the budget is stopped by the guard or runs out of memory, cleanly, no process left; the live
line is computed from a CUDA run's ledger. NOT RUN until a GPU is lent."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu.registry import Ctx, Outcome, claim

MIB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 0.10  # predicted within 10% of the measured peak


def _probe(ctx: Ctx, name: str, points: list[tuple[int, int]], **kw: Any) -> dict[str, Any]:
    """FitProbe on this device, to its end; its points and fit.json as plain data."""
    from probes.analysis.fit_file import fit_document
    from probes.runfolder import create_run_dir
    from trainer.fitprobe import FitProbe

    cfg = ctx.config(steps=0, warmup_steps=0, save_weights=False, **kw.pop("config", {}))
    run_dir = create_run_dir(ctx.out / "runs" / name)
    probe = FitProbe(cfg, run_dir, points, listen=False, **kw)
    probe.start()
    if not probe.join(min(240.0, max(5.0, ctx.left_s()))):
        probe.control.stop("gpu_check: time limit")
        probe.join(30)
        raise TimeoutError(f"{name}: the probe did not finish")
    meta = {"device": probe.device_text, "budget_bytes": probe.budget_bytes,
            "headroom_pct": probe.headroom_pct, "batch_size": cfg.batch_size,
            "seq_len": cfg.seq_len, "max_seq_len": cfg.block_size}
    doc = fit_document(meta, list(probe.points), "finished")
    out = {"points": probe.points, "doc": doc, "exit_code": probe.exit_code,
           "error": probe.status.error, "run_dir": str(run_dir)}
    del probe
    return out


def _fresh(ctx: Ctx, b: int, t: int, budget: int | None = None) -> dict[str, Any] | None:
    """One size in a fresh process (`python -m trainer.fitprobe`), as --verify runs it."""
    from trainer.config import TrainConfig

    folder = Path(tempfile.mkdtemp(prefix="fit-", dir=ctx.out))
    cfg = TrainConfig(device=ctx.device, steps=0, warmup_steps=2, save_weights=False,
                      batch_size=b, seq_len=t, max_memory_bytes=budget)
    cmd = [sys.executable, "-m", "trainer.fitprobe", "--run-folder", str(folder), "--config",
           json.dumps(cfg.to_json()), "--points", f"{b}x{t}", "--steps", "3"]
    if budget is not None:
        cmd += ["--budget", str(budget)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    points = [r for r in rows if r.get("event") == "fit_point"]
    return dict(points[-1], exit_code=done.returncode) if points else None


@claim("fit_probe_survives_an_oom", "an OOM inside memtop fit's probe is recorded as a point "
       "that does not fit: no error row, the allocator emptied (allocated back to its level), "
       "the points before it fitted", group="fit", needs_s=40)
def fit_probe_survives_an_oom(ctx: Ctx) -> Outcome:
    dev = ctx.torch_device
    total = torch.cuda.get_device_properties(dev).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, 2048 * MIB / total), dev)
    try:
        before = torch.cuda.memory_allocated(dev)
        run = _probe(ctx, "fit_oom", [(1, 128), (2, 128), (4, 128), (4096, 128)],
                     refine=False)
        after = torch.cuda.memory_allocated(dev)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, dev)
        torch.cuda.empty_cache()
    statuses = [p["status"] for p in run["points"]]
    ok = (statuses == ["ok", "ok", "ok", "oom"] and run["error"] is None
          and run["doc"]["fit"] is not None and after <= before + 64 * MIB)
    return Outcome.check(ok, f"points {statuses}, error {run['error']}, allocated "
                             f"{before / MIB:.0f} -> {after / MIB:.0f} MiB, oom reason "
                             f"{run['points'][-1].get('reason')}", statuses=statuses,
                         allocated_before=before, allocated_after=after)


@claim("fit_predicts_peak_reserved", "memtop fit's prediction from B = 1, 2, 4 of the peak "
       "reserved at B = 16 and 32 is within 10% of the peak measured in a fresh process",
       group="fit", needs_s=90, limit_s=300)
def fit_predicts_peak_reserved(ctx: Ctx) -> Outcome:
    from probes.analysis.fit import predict

    run = _probe(ctx, "fit_predict", [(1, 128), (2, 128), (4, 128), (4, 32), (4, 64)],
                 refine=False)
    fit = run["doc"]["fit"]
    errors: dict[str, Any] = {}
    for b in (16, 32):
        got = _fresh(ctx, b, 128)
        if got is None or got.get("status") != "ok":
            errors[str(b)] = f"no measurement: {got}"
            continue
        want = predict(fit, b, 128)
        errors[str(b)] = {"peak": (want["peak_bytes"] - got["peak_bytes"]) / got["peak_bytes"],
                          "allocated": (want["counter_peak_bytes"] - got["counter_peak_bytes"])
                          / got["counter_peak_bytes"]}
    ok = all(isinstance(e, dict) and abs(e["peak"]) <= TOLERANCE
             and abs(e["allocated"]) <= TOLERANCE for e in errors.values())
    return Outcome.check(ok, f"errors {errors}", errors=errors, band=fit["band"])


@claim("fit_verify_on_cuda", "memtop fit --verify on CUDA: the largest B runs under the budget "
       "and the first B over it is stopped by the memory guard or runs out of memory, the "
       "verification processes gone, every row in fit.json", group="fit", needs_s=120,
       limit_s=420)
def fit_verify_on_cuda(ctx: Ctx) -> Outcome:
    run = _probe(ctx, "fit_budget", [(1, 128), (2, 128), (4, 128)], refine=False)
    rest = sum(p["bytes"] for p in run["doc"]["fit"]["parts"] if "bytes" in p)
    budget = int(rest + 1024 * MIB)
    out = ctx.out / "runs" / "fit_verify"
    done = subprocess.run([sys.executable, "-m", "tui.cli", "fit", "--device", ctx.device,
                           "--vary", "batch", "--memory", str(budget), "--verify",
                           "--run-dir", str(out)], capture_output=True, text=True, cwd=ROOT,
                          timeout=400)
    folders = list(out.iterdir()) if out.is_dir() else []
    if done.returncode != 0 or not folders:
        return Outcome.check(False, f"exit {done.returncode}: {done.stderr[-500:]}")
    doc = json.loads((folders[0] / "fit.json").read_text())
    rows = {r["what"]: r for r in doc.get("verification") or []}
    left = subprocess.run(["pgrep", "-f", "trainer.fitprobe"], capture_output=True, text=True)
    largest = rows.get("largest B", {})
    ran_under = largest.get("status") == "ok" and (largest.get("measured_bytes") or 0) <= budget
    ok = (ran_under and rows.get("first B over", {}).get("agrees") is True
          and not left.stdout.strip())  # "agrees" for the largest: also within its band,
    return Outcome.check(ok, json.dumps({k: {f: v.get(f) for f in (  # recorded, not required
        "batch_size", "status", "measured_bytes", "predicted_bytes", "error", "band",
        "verdict", "exit_code")} for k, v in rows.items()}), rows=rows, budget_bytes=budget)


@claim("fit_live_line_on_cuda", "a CUDA training run's ledger carries the level between steps "
       "and the budget, and the live 'fits B ≤ …' line is computed from it and its rows",
       group="fit", needs_s=30)
def fit_live_line_on_cuda(ctx: Ctx) -> Outcome:
    from probes.analysis.fit_live import live_fit, live_line, steady_peaks

    run = ctx.train("fit_live", ctx.config(steps=20, warmup_steps=3))
    ledgers = run.events("ledger")
    if not ledgers:
        return Outcome.check(False, "no ledger event")
    data = ledgers[-1].data
    rows = [s.to_json() for s in run.steps()]
    live = live_fit(data, steady_peaks(data, rows))
    line = live_line(live)
    return Outcome.check(line is not None and live["largest_batch"] >= 16,
                         f"{line}; rest {data.get('rest')}, budget {data.get('budget_bytes')} "
                         f"({data.get('budget_source')})", live=live)
