"""GPU claims about whole runs on CUDA: the leak detector on the two demo leaks, inference's KV
cache, sdpa attention, the own-loop example, a world-size-1 NCCL process group, a run on cuda:N,
and the dashboard drawn over a CUDA trainer."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from gpu_registry import Ctx, Outcome, claim, free_device

ROOT = Path(__file__).resolve().parent.parent


# ---- the leak detector ------------------------------------------------------------------------
def logits_leak(ctx: Ctx) -> dict[str, Any]:
    """--leak logits from step 20 to 45: each step's logits kept on the device."""
    def make() -> dict[str, Any]:
        cfg = ctx.config(steps=70, leak="logits", leak_at=20, leak_stop_at=45)
        run = ctx.train("leak_logits", cfg, timeout_s=120)
        per_elem = 2 if cfg.amp_mode in ("fp16", "bf16") else 4
        return {"alerts": [(e.step, e.data.get("counter"), e.data.get("bytes_per_step"))
                           for e in run.events("leak_suspected")],
                "cleared": [(e.step, e.data.get("counter")) for e in run.events("leak_cleared")],
                "expected": cfg.batch_size * cfg.seq_len * 256 * per_elem}

    return ctx.shared("leak_logits", make)


@claim("logits_leak_alert_on_device", "the logits leak (B×T×V half-precision logits kept each "
       "step) raises leak_suspected on device_allocated within 10 steps, at 0.5–2× the logits' "
       "bytes per step", group="leaks", needs_s=25, priority=45)
def logits_leak_alert_on_device(ctx: Ctx) -> Outcome:
    d = logits_leak(ctx)
    mine = [a for a in d["alerts"] if a[1] == "device_allocated"]
    if not mine:
        return Outcome.check(False, f"no alert on device_allocated: {d['alerts']}")
    step, _, rate = mine[0]
    ok = step - 20 <= 10 and 0.5 * d["expected"] <= (rate or 0) <= 2 * d["expected"]
    return Outcome.check(ok, f"alert {step - 20} steps after the leak began, {rate:,.0f} B/step "
                             f"(logits {d['expected']:,} B)", alerts=d["alerts"])


@claim("logits_leak_cleared", "the device_allocated alert clears after the leak is stopped",
       group="leaks", needs_s=25, priority=45)
def logits_leak_cleared(ctx: Ctx) -> Outcome:
    d = logits_leak(ctx)
    done = [c for c in d["cleared"] if c[1] == "device_allocated" and c[0] >= 45]
    return Outcome.check(bool(done), f"cleared {done[0][0] - 45} steps after the fix" if done
                         else f"not cleared: {d['cleared']}", cleared=d["cleared"])


@claim("graph_leak_alert_on_cuda", "the `l` key's graph demo on CUDA (its backward retains "
       "the graph and the loss is kept: the saved activations stay on the device, as real graph "
       "leaks there do; trainer/leaks.py) raises leak_suspected within 10 steps",
       group="leaks", needs_s=20, priority=46)
def graph_leak_alert_on_cuda(ctx: Ctx) -> Outcome:
    run = ctx.train("leak_graph", ctx.config(steps=40, leak="graph", leak_at=20))
    alerts = [(e.step, e.data.get("counter"), e.data.get("bytes_per_step"))
              for e in run.events("leak_suspected")]
    started = [e.data.get("hint") for e in run.events("leak_demo_started")]
    first = alerts[0] if alerts else None
    ok = first is not None and first[0] - 20 <= 10
    return Outcome.check(ok, f"first alert {first}, {first[0] - 20} steps after the demo began"
                         if first else "no alert", alerts=alerts, demo_hint=started)


@claim("host_heap_leak_alert_on_cuda", "a graph kept after an ordinary backward (examples/"
       "leaky_loops.py's graph loop: ~512 B/step of device memory, its autograd nodes on the "
       "host) raises leak_suspected on host_heap on CUDA: the host heap is watched there at its "
       "budgeted rate (probes/counters/memory.py)", group="leaks", needs_s=25, priority=46)
def host_heap_leak_alert_on_cuda(ctx: Ctx) -> Outcome:
    from gpu_claims_culprits import culprit_run

    d = culprit_run(ctx, "graph", steps=60)
    alerts = [(a.get("step"), a.get("counter"), a.get("bytes_per_step")) for a in d["alerts"]]
    host = [a for a in alerts if a[1] == "host_heap"]
    return Outcome.check(bool(host), f"first host_heap alert {host[0]}" if host else
                         f"no host_heap alert: {alerts}", alerts=alerts)


# ---- inference, attention, the example loop ----------------------------------------------------
@claim("infer_kv_bytes_on_cuda", "memtop infer on CUDA: every decode row's measured KV cache "
       "bytes equal 2 × layers × B × T × dim × bytes, and every request finishes",
       group="infer", needs_s=20, priority=50)
def infer_kv_bytes_on_cuda(ctx: Ctx) -> Outcome:
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


@claim("sdpa_peak_below_explicit", "--attention sdpa trains on CUDA and at T=512 keeps a lower "
       "step peak than explicit attention (no B×h×T² scores)", group="attention", needs_s=25,
       priority=55)
def sdpa_peak_below_explicit(ctx: Ctx) -> Outcome:
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


@claim("own_loop_on_cuda", "examples/own_loop.py (probes.Monitor over a CNN) on CUDA: fp16 with "
       "a GradScaler, its rows on cuda with a scale, run_finished 'finished'", group="monitor",
       needs_s=20, priority=60)
def own_loop_on_cuda(ctx: Ctx) -> Outcome:
    sys.path.insert(0, str(ROOT / "examples"))
    import own_loop

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


@claim("nccl_world_size_1", "a world-size-1 NCCL process group: memtop's trainer wraps the model "
       "in DistributedDataParallel, writes metrics-rank-0.jsonl and saves one loadable "
       "weights.pt (the unwrapped model's)", group="ranks", needs_s=20, priority=65)
def nccl_world_size_1(ctx: Ctx) -> Outcome:
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


@claim("cuda_n_no_context_on_0", "--device cuda:N (the last GPU) creates no CUDA context on "
       "cuda:0 (NVML lists the process on cuda:N only)", group="cuda_n", needs_s=20, priority=90)
def cuda_n_no_context_on_0(ctx: Ctx) -> Outcome:
    if torch.cuda.device_count() < 2:
        return Outcome.not_run("needs two GPUs")
    d = _cuda_n(ctx)
    seen = d["seen"]
    return Outcome.check(seen.get(d["last"]) is True and seen.get("cuda:0") is False,
                         f"pid seen per GPU: {seen}")


@claim("cuda_n_nvml_by_uuid", "NVML is matched to cuda:N by UUID", group="cuda_n", needs_s=20,
       priority=90)
def cuda_n_nvml_by_uuid(ctx: Ctx) -> Outcome:
    if torch.cuda.device_count() < 2:
        return Outcome.not_run("needs two GPUs")
    d = _cuda_n(ctx)
    return Outcome.check("by UUID" in str(d.get("nvml_match")), str(d.get("nvml_match")))


# ---- the dashboard ----------------------------------------------------------------------------
@claim("dashboard_renders_on_cuda", "the dashboard (120×40, App.run_test) over a CUDA trainer: "
       "panes filled, the GPU named in the header, the scale pane live (fp16), dashboard.svg and "
       "(when the table arrives) profiler.svg saved, the trainer joined after q",
       group="dashboard", needs_s=40, priority=80, limit_s=150)
def dashboard_renders_on_cuda(ctx: Ctx) -> Outcome:
    try:
        from tui.app import MemtopApp
    except ImportError as exc:
        return Outcome.not_run(f"the dashboard cannot import: {exc}")
    return asyncio.run(_dashboard(ctx, MemtopApp))


async def _dashboard(ctx: Ctx, app_class: Any) -> Outcome:
    import torch._dynamo  # noqa: F401  (see below)

    from probes.runfolder import create_run_dir

    # torch.optim's first optimizer imports torch._dynamo, whose sympy keeps `from sys import
    # stdout` as a module global: imported while the app captures stdout, it would hold the
    # app (and its run) for good. Every other claim imports it first; --only dashboard too.

    app = app_class.for_run(ctx.config(steps=0), create_run_dir(ctx.out / "runs" / "dashboard"),
                            freeze_gc=False)
    problems: list[str] = []
    figures: dict[str, Any] = {}

    async def wait_for(pilot, cond, timeout_s: float) -> bool:
        t0 = time.monotonic()
        while not cond():
            if time.monotonic() - t0 > min(timeout_s, max(1.0, ctx.left_s() - 5)):
                return False
            await pilot.pause(0.2)
        return True

    try:
        async with app.run_test(size=(120, 40)) as pilot:
            try:
                await _look(ctx, app, pilot, wait_for, problems, figures)
            finally:  # whatever happened, q: the trainer stops at its next step boundary
                await pilot.press("q")
                await wait_for(pilot, lambda: app.return_code is not None, 60)
    finally:
        app.shutdown(timeout_s=30)  # and is joined before the claim ends
    if app.trainer.alive:
        problems.append("the trainer thread is still alive after q")
    app = None  # the app holds the trainer and its model: gone before the cache is emptied
    free_device()
    alive = [t.name for t in threading.enumerate() if t.name.startswith("memtop-trainer")]
    return Outcome.check(not problems, "; ".join(problems) or
                         f"header: {str(figures.get('header', '')).strip()}; svgs: "
                         f"{[k for k in figures if k.endswith('svg')]}",
                         trainer_threads_left=alive, **figures)


async def _look(ctx: Ctx, app: Any, pilot: Any, wait_for: Any, problems: list[str],
                figures: dict[str, Any]) -> None:
    """30 steps on screen: the panes, the header, dashboard.svg; then p and profiler.svg."""
    ok = await wait_for(pilot, lambda: app.trainer.status.step >= 30
                        or app.trainer.status.state == "failed", 90)
    if not ok or app.trainer.status.state == "failed":
        problems.append(f"trainer: {app.trainer.status.state}, step "
                        f"{app.trainer.status.step}, {app.trainer.status.error}")
        return
    app.redraw_chart()
    ticks = app.ticks
    await wait_for(pilot, lambda: app.ticks >= ticks + 2, 10)
    await pilot.pause(0.3)
    figures["dashboard_svg"] = str(app.save_screenshot(filename="dashboard.svg",
                                                       path=str(ctx.out)))
    panes = {k: p.top_text for k, p in app.panes.items()}
    figures.update(header=app.header_bar.text, panes=panes)
    name = torch.cuda.get_device_name(ctx.torch_device)
    if "n/a" in panes["allocated"]:
        problems.append(f"allocated pane: {panes['allocated']}")
    if name.split()[-1] not in app.header_bar.text:
        problems.append(f"GPU name not in the header: {app.header_bar.text}")
    if "no scaler" in panes["scale"]:
        problems.append(f"scale pane: {panes['scale']}")
    await pilot.press("p")
    if await wait_for(pilot, lambda: bool(app.ops_table.ops), 60):
        app.clear_notifications()
        await pilot.pause(0.6)
        figures["profiler_svg"] = str(app.save_screenshot(filename="profiler.svg",
                                                          path=str(ctx.out)))
