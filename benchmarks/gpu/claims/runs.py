"""GPU claims about whole runs on CUDA: inference's KV cache, sdpa attention, the own-loop
example, a world-size-1 NCCL process group and a run on cuda:N (the leak detector: leaks.py, the
dashboard: dashboard.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import torch

from benchmarks.gpu.device import free_device
from benchmarks.gpu.registry import Ctx, Outcome, claim
from benchmarks.harness.examples import example
from benchmarks.harness.paths import ROOT


# ---- inference, attention, the example loop ----------------------------------------------------
@claim(group="infer", needs_s=20, priority=50)
def infer_kv_bytes_on_cuda(ctx: Ctx) -> Outcome:
    """memtop infer on CUDA: every decode row's measured KV cache bytes equal 2 × layers × B × T
    × dim × bytes, and every request finishes"""
    from probes.records import StepSample
    from probes.runfolder import create_run_dir
    from trainer.infer import InferenceRunner
    from trainer.infer_config import InferConfig, prepare_model

    cfg = InferConfig(device=ctx.device, batch_size=8, prompt_len=64, new_tokens=32,
                      requests=2, baseline_tokens=4, profile_phase="none",
                      run_dir=str(ctx.out / "runs" / "infer"))
    records: list[Any] = []
    runner = InferenceRunner(cfg, prepare_model(cfg), create_run_dir(cfg.run_dir),
                             sinks=[records.append], listen=False, freeze_gc=False)
    runner.start()
    finished = runner.join(120)
    code = runner.exit_code
    del runner
    free_device()
    decode = [r for r in records if isinstance(r, StepSample) and r.phase == "decode"]
    bad = [r.step for r in decode if not r.kv_cache_bytes
           or r.kv_cache_bytes != r.kv_cache_predicted_bytes]
    done = [r for r in records if getattr(r, "event", None) == "request_done"]
    ok = finished and code == 0 and bool(decode) and not bad and len(done) == 2
    last = decode[-1] if decode else None
    return Outcome.check(ok, f"{len(decode)} decode rows, {len(bad)} off the formula; last "
                             f"{last.kv_cache_bytes if last else None} B measured vs "
                             f"{last.kv_cache_predicted_bytes if last else None} B; "
                             f"{len(done)} requests done; exit {code}")


@claim(group="attention", needs_s=25, priority=55)
def sdpa_peak_below_explicit(ctx: Ctx) -> Outcome:
    """--attention sdpa trains on CUDA and at T=512 keeps a lower step peak than explicit
    attention (no B×h×T² scores)"""
    peaks, losses = {}, {}
    for attention in ("explicit", "sdpa"):
        run = ctx.train(f"attention_{attention}", ctx.config(
            steps=8, attention=attention, seq_len=512, block_size=512, batch_size=8))
        peaks[attention] = run.max_step_peak()
        losses[attention] = [s.loss for s in run.steps()]
    finite = all(x is not None and x == x for v in losses.values() for x in v)
    ok = finite and None not in peaks.values() and peaks["sdpa"] < peaks["explicit"]
    return Outcome.check(ok, f"step peak sdpa {peaks['sdpa']:,} B vs explicit "
                             f"{peaks['explicit']:,} B; losses finite: {finite}", peaks=peaks)


@claim(group="monitor", needs_s=20, priority=60)
def own_loop_on_cuda(ctx: Ctx) -> Outcome:
    """examples/own_loop.py (probes.Monitor over a CNN) on CUDA: fp16 with a GradScaler, its
    rows on cuda with a scale, run_finished 'finished'"""
    own_loop = example("own_loop")

    runs = ctx.out / "runs" / "own_loop"
    code = own_loop.main(["--device", "cuda", "--steps", "12", "--run-dir", str(runs)])
    free_device()
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "event" not in r]
    end = [r for r in rows if r.get("event") == "run_finished"]
    ok = (code == 0 and len(steps) == 12 and all(
        r["device"].startswith("cuda") and r["amp"] == "fp16" and r["scale"] for r in steps)
        and bool(end) and end[-1].get("reason") == "finished")
    last = steps[-1] if steps else {}
    return Outcome.check(ok, f"exit {code}, {len(steps)} rows on {last.get('device')}, amp "
                             f"{last.get('amp')}, scale {last.get('scale')}")


@claim(group="ranks", needs_s=20, priority=65)
def nccl_world_size_1(ctx: Ctx) -> Outcome:
    """a world-size-1 NCCL process group: memtop's trainer wraps the model in
    DistributedDataParallel, writes metrics-rank-0.jsonl and saves one loadable weights.pt (the
    unwrapped model's)"""
    import torch.distributed as dist

    from probes.control.requests import RunControl
    from probes.monitor import default_hooks
    from probes.runfolder import create_run_dir
    from trainer.checkpoint import read_weights
    from trainer.loop import Trainer

    if not dist.is_nccl_available():
        return Outcome.not_run("this torch has no NCCL")
    dev = ctx.torch_device  # DistributedDataParallel's device_ids and set_device want an index
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        cfg = ctx.config(steps=10)
        run_dir = create_run_dir(ctx.out / "runs" / "nccl")
        trainer = Trainer(cfg, run_dir, RunControl(), hooks=default_hooks(**cfg.hook_options()),
                          rank=0, device=dev, ddp=True, freeze_gc=False, listen=False)
        trainer.start()
        finished = trainer.join(90)
        code = trainer.exit_code
        del trainer
        backend = dist.get_backend()
    finally:
        dist.destroy_process_group()
        free_device()
    rows = [json.loads(x) for x in (run_dir / "metrics-rank-0.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "event" not in r]
    header, state = read_weights(run_dir / "weights.pt")
    ok = finished and code == 0 and len(steps) == 10 and backend == "nccl" and not any(
        k.startswith("module.") for k in state)
    return Outcome.check(ok, f"backend {backend}, exit {code}, {len(steps)} rows, weights.pt "
                             f"at step {header.get('step')} with {len(state)} tensors")


CHILD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import torch
from probes.control.requests import RunControl
from probes.counters.nvml import candidate_uuids
from probes.runfolder import create_run_dir
from trainer.config import TrainConfig
from trainer.loop import Trainer
import pynvml
cfg = TrainConfig(device=sys.argv[2], steps=20, run_dir=sys.argv[3])
seen = {}
def sink(rec):
    if getattr(rec, "step", 0) == 15 and hasattr(rec, "tokens_per_s"):
        pynvml.nvmlInit()
        for i in range(torch.cuda.device_count()):
            for text in candidate_uuids(str(torch.cuda.get_device_properties(i).uuid)):
                try:
                    h = pynvml.nvmlDeviceGetHandleByUUID(text)
                except Exception:
                    continue
                pids = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
                seen[f"cuda:{i}"] = os.getpid() in pids
        pynvml.nvmlShutdown()
t = Trainer(cfg, create_run_dir(sys.argv[3]), RunControl(), sinks=[sink], listen=False)
code = t.run()
rows = [json.loads(x) for x in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
started = next(x for x in rows if x.get("event") == "run_started")
print(json.dumps({"code": code, "seen": seen, "nvml_match": started.get("nvml_match")}))
"""


def _cuda_n(ctx: Ctx) -> dict[str, Any]:
    def make() -> dict[str, Any]:
        last = f"cuda:{torch.cuda.device_count() - 1}"
        res = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), last,
                              str(ctx.out / "runs" / "cuda_n")], capture_output=True,
                             text=True, timeout=max(10.0, min(120.0, ctx.left_s())))
        out = json.loads(res.stdout.strip().splitlines()[-1])
        return {**out, "last": last}

    return ctx.shared("cuda_n", make)


@claim(group="cuda_n", needs_s=20, priority=90)
def cuda_n_no_context_on_0(ctx: Ctx) -> Outcome:
    """--device cuda:N (the last GPU) creates no CUDA context on cuda:0 (NVML lists the process
    on cuda:N only)"""
    if torch.cuda.device_count() < 2:
        return Outcome.not_run("needs two GPUs")
    d = _cuda_n(ctx)
    seen = d["seen"]
    return Outcome.check(seen.get(d["last"]) is True and seen.get("cuda:0") is False,
                         f"pid seen per GPU: {seen}")


@claim(group="cuda_n", needs_s=20, priority=90)
def cuda_n_nvml_by_uuid(ctx: Ctx) -> Outcome:
    """NVML is matched to cuda:N by UUID"""
    if torch.cuda.device_count() < 2:
        return Outcome.not_run("needs two GPUs")
    d = _cuda_n(ctx)
    return Outcome.check("by UUID" in str(d.get("nvml_match")), str(d.get("nvml_match")))
