"""gpu_check's checks that exist only on CUDA: OOM capture, syncs per step, step time
against CUDA events, per-step sample cost, a run on cuda:N, report and ledger on CUDA.

Each check records claims (PASS / FAIL / NOT RUN) through gpu_check's Result. The pure parts
(per-step sync counts, timing agreement) are functions tested on CPU in
tests/unit/test_gpu_check.py.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts the repo root on sys.path)
import torch

from probes.instruments.hooks import StepHook
from probes.records import StepSample

MIB = 1024 * 1024
SAMPLE_TARGET_US = 20.0  # the per-step sample budget, as on CPU (benchmarks/RESULTS.md)


def _gc() -> Any:
    """gpu_check's module (the running script, not a second import of it)."""
    main = sys.modules.get("__main__")
    if main is not None and hasattr(main, "train") and hasattr(main, "events_of"):
        return main
    import gpu_check

    return gpu_check


# ---- pure parts ---------------------------------------------------------------------------
def per_step_counts(marks: dict[int, int]) -> dict[int, int]:
    """Counts between successive step starts: ``marks[step]`` is the running total seen when
    ``step`` began, so step s owns ``marks[s + 1] - marks[s]`` (its end-of-step read included)."""
    steps = sorted(marks)
    return {s: marks[n] - marks[s] for s, n in zip(steps, steps[1:], strict=False)}


def agreement(wall_ms: list[float], device_ms: list[float]) -> dict[str, float] | None:
    """Median ratio of memtop's wall step time to the CUDA-event time of the same steps."""
    pairs = [(w, d) for w, d in zip(wall_ms, device_ms, strict=True) if d > 0]
    if not pairs:
        return None
    ratios = [w / d for w, d in pairs]
    return {"median_ratio": statistics.median(ratios), "min_ratio": min(ratios),
            "max_ratio": max(ratios), "steps": len(pairs)}


# ---- hooks used on the training thread ------------------------------------------------------
class SyncCounter(StepHook):
    """Counts torch's sync-debug warnings per step (set_sync_debug_mode("warn")) and records
    CUDA events at each step's start and end (the sink marks the end, after the step's one read).
    """

    def __init__(self) -> None:
        self.caught: list[Any] = []
        self.marks: dict[int, int] = {}
        self.events: dict[int, tuple[Any, Any]] = {}
        self.wall_ms: dict[int, float] = {}
        self._step = 0

    @contextlib.contextmanager
    def step_context(self, step: int):
        self.marks[step] = len(self.caught)
        self._step = step
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        self.events[step] = (start, None)
        yield

    def sink(self, record: Any) -> None:
        if isinstance(record, StepSample) and record.step in self.events:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.events[record.step] = (self.events[record.step][0], end)
            self.wall_ms[record.step] = record.step_ms

    def device_ms(self) -> dict[int, float]:
        torch.cuda.synchronize()
        return {s: a.elapsed_time(b) for s, (a, b) in self.events.items() if b is not None}


@contextlib.contextmanager
def sync_warnings(into: list[Any]):
    """Every synchronising CUDA call as a warning in ``into`` (all threads), then mode 0."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(0)
            into.extend(w for w in caught if "synchroniz" in str(w.message).lower())


def plain_sync_count(cfg: Any, fused: bool, steps: int = 8) -> list[int]:
    """Calibration: a plain fp16 loop (loss.item() per step) counted the same way; a non-fused
    AdamW must show one more sync per step (GradScaler's found-inf .item()) than a fused one."""
    from trainer.data import BatchSampler, load_corpus
    from trainer.model import GPT

    device = cfg.torch_device
    model = GPT(cfg.model_config()).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    scaler = torch.amp.GradScaler("cuda")
    batches = BatchSampler(load_corpus(), cfg.batch_size, cfg.seq_len, cfg.seed, device)
    counts: list[int] = []
    for _ in range(steps):
        x, y = batches.next_batch()
        caught: list[Any] = []
        with sync_warnings(caught):
            with torch.autocast("cuda", dtype=torch.float16):
                _, loss = model(x, y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            loss.item()
        counts.append(len(caught))
    return counts


# ---- checks (ctx and r are gpu_check's Ctx and Result) --------------------------------------
def check_sync_count(ctx: Any, r: Any) -> None:
    train = _gc().train
    if not ctx.is_cuda:
        r.status, r.summary = "skip", "CUDA only"
        return
    counter = SyncCounter()
    cfg = ctx.config(amp="fp16", steps=30)
    with sync_warnings(counter.caught):
        trainer, _ = train(ctx, "sync_count", cfg, sinks=[counter.sink], hooks=[counter])
    counts = per_step_counts(counter.marks)
    steady = [c for s, c in counts.items() if s > cfg.warmup_steps]
    fused = plain_sync_count(cfg, fused=True)
    unfused = plain_sync_count(cfg, fused=False)
    r.figures.update(memtop_syncs_per_step=counts, plain_fused=fused, plain_unfused=unfused,
                     warning_sample=[str(w.message)[:160] for w in counter.caught[:3]])
    med = statistics.median(steady) if steady else None
    calibrated = statistics.median(unfused) == statistics.median(fused) + 1
    r.claim("sync_counting_works", calibrated,
            f"plain loop: fused {fused}, non-fused {unfused} syncs per step")
    r.claim("one_sync_per_step", med == 1 and calibrated,
            f"memtop fp16 + fused AdamW: median {med} per step after warmup "
            f"(max {max(steady) if steady else None})")
    wall = [counter.wall_ms[s] for s in sorted(counter.wall_ms) if s > cfg.warmup_steps]
    dev_ms = counter.device_ms()
    dev = [dev_ms.get(s, 0.0) for s in sorted(counter.wall_ms) if s > cfg.warmup_steps]
    agree = agreement(wall, dev)
    r.figures["step_time_vs_cuda_events"] = agree
    ok = agree is not None and 0.9 <= agree["median_ratio"] <= 1.1
    r.claim("step_time_matches_cuda_events", ok, f"wall/CUDA-event median ratio "
            f"{agree['median_ratio']:.3f}" if agree else "no CUDA event times")
    r.summary = (f"memtop {med} sync/step (plain fused {statistics.median(fused)}, "
                 f"non-fused {statistics.median(unfused)}); step time vs CUDA events "
                 f"{agree['median_ratio']:.3f}" if agree else "no timing")
    r.expect(trainer.exit_code == 0, f"trainer exit code {trainer.exit_code}")


def check_sample_cost(ctx: Any, r: Any) -> None:
    from probes.counters.memory import MemoryProbe

    if not ctx.is_cuda:
        r.status, r.summary = "skip", "CUDA only"
        return
    dev = torch.device(ctx.device)
    keep = torch.empty(64 * MIB, dtype=torch.uint8, device=dev)  # a non-trivial allocator state
    probe = MemoryProbe(dev)
    n = 2000

    def per_call(fn) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n * 1e6

    def step_sample() -> None:
        probe.begin_step()
        probe.read()

    def three_getters() -> None:
        torch.cuda.memory_allocated(dev)
        torch.cuda.memory_reserved(dev)
        torch.cuda.max_memory_allocated(dev)

    ours = per_call(step_sample)
    old = per_call(three_getters)
    probe.close()
    del keep
    r.figures.update(memtop_sample_us=ours, three_getters_us=old, target_us=SAMPLE_TARGET_US)
    r.claim("sample_cost", ours <= SAMPLE_TARGET_US,
            f"begin_step + read {ours:.1f} µs (three getters: {old:.1f} µs)")
    r.summary = f"per-step sample {ours:.1f} µs vs three getters {old:.1f} µs"


def check_oom_capture(ctx: Any, r: Any) -> None:
    """An OOM on purpose (the allocator capped with set_per_process_memory_fraction): the error
    row names memory_summary and a snapshot, state-only without history, with traces with it."""
    train, events_of = _gc().train, _gc().events_of
    if not ctx.is_cuda:
        r.status, r.summary = "skip", "CUDA only"
        return
    dev = torch.device(ctx.device)
    total = torch.cuda.get_device_properties(dev).total_memory
    cap = 2 * 1024 * MIB
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), dev)
    try:
        for history in (False, True):
            name = "oom_history" if history else "oom_plain"
            cfg = ctx.config(steps=3, batch_size=4096, memory_history=history)
            trainer, records = train(ctx, name, cfg, timeout_s=120)
            err = events_of(records, "error")
            data = err[0].data if err else {}
            oom = "OutOfMemory" in str(data.get("error_type", ""))
            files = [data.get("memory_summary"), data.get("memory_snapshot")]
            present = all(f and (trainer.run_dir / f).is_file() for f in files)
            traces = None
            if present:
                import pickle

                with open(trainer.run_dir / files[1], "rb") as fh:
                    snap = pickle.load(fh)
                traces = sum(len(t) for t in snap.get("device_traces", []))
            r.figures[name] = {k: data.get(k) for k in (
                "error_type", "memory_summary", "memory_snapshot", "memory_snapshot_s",
                "memory_snapshot_kind")} | {"trace_entries": traces}
            r.claim(f"{name}_artifacts", oom and present,
                    f"{data.get('error_type')}: {files}, dump "
                    f"{data.get('memory_snapshot_s')} s, {traces} trace entries")
            if history:
                r.claim("oom_history_has_traces", bool(traces), f"{traces} trace entries")
            else:
                r.claim("oom_plain_state_only", traces == 0 and "state only" in str(
                    data.get("memory_snapshot_kind")), f"{traces} trace entries")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, dev)
        torch.cuda.empty_cache()
    r.summary = "; ".join(f"{k}: {v.get('error_type')} dump {v.get('memory_snapshot_s')} s, "
                          f"{v.get('trace_entries')} traces"
                          for k, v in r.figures.items() if isinstance(v, dict))


def check_report_ledger(ctx: Any, r: Any) -> None:
    """report.json and the ledger on a CUDA run: MFU for a known GPU, the ledger's device
    figures, the fragmentation counters read back."""
    train, events_of = _gc().train, _gc().events_of
    from probes.analysis.report.build import write_report
    from probes.control.requests import Request, RunControl

    cfg = ctx.config(steps=25)
    control = RunControl()
    control.submit(Request("memory_snapshot", at_step=12, source="gpu_check"))
    trainer, records = train(ctx, "report_ledger", cfg, control=control)
    snaps = events_of(records, "memory_snapshot")
    path = write_report(trainer.run_dir)
    report = json.loads(path.with_suffix(".json").read_text())
    res = report.get("results", {})
    ledger = events_of(records, "ledger")
    r.figures.update(mfu=res.get("mfu"), mfu_note=res.get("mfu_note"),
                     ledger_events=len(ledger),
                     ledger_counter=ledger[-1].data.get("counter") if ledger else None)
    if not ctx.is_cuda:  # the smoke run exercises the code; the claims are about CUDA
        for key in ("report_written", "ledger_on_cuda", "mfu_or_reason", "snapshot_request"):
            r.claim(key, None, "CPU smoke run")
    else:
        device = str(ledger[-1].data.get("device", "")) if ledger else ""
        r.claim("report_written", path.is_file(), str(path.name))
        r.claim("ledger_on_cuda", device.startswith("cuda"), f"{len(ledger)} ledger events "
                f"on {device or 'no device'}")
        r.claim("mfu_or_reason", res.get("mfu") is not None or bool(res.get("mfu_note")),
                f"mfu {res.get('mfu')}: {res.get('mfu_note')}")
        snap = snaps[0].data if snaps else {}
        r.claim("snapshot_request", bool(snap.get("path")) and (trainer.run_dir / str(
            snap.get("path"))).is_file() and snap.get("kind") == "state only"
            and snaps[0].step == 11, f"{len(snaps)} events: {snap}")
    r.summary = f"report.md written; mfu {res.get('mfu')}; {len(ledger)} ledger events"


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
dev = sys.argv[2]
cfg = TrainConfig(device=dev, steps=20, run_dir=sys.argv[3])
seen = {}
def sink(rec):
    if getattr(rec, "step", 0) == 15 and hasattr(rec, "tokens_per_s"):
        pynvml.nvmlInit()
        for i in range(torch.cuda.device_count()):
            uuid = str(torch.cuda.get_device_properties(i).uuid)
            for text in candidate_uuids(uuid):
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
print(json.dumps({"code": code, "seen": seen, "device": started.get("device"),
                  "nvml_match": started.get("nvml_match")}))
"""


def check_cuda_n(ctx: Any, r: Any) -> None:
    """A run on the last GPU in a fresh process: no CUDA context on cuda:0 (NVML lists the pid
    only on the chosen GPU), NVML matched by UUID."""
    if not ctx.is_cuda or torch.cuda.device_count() < 2:
        r.status, r.summary = "skip", "needs two GPUs"
        return
    last = f"cuda:{torch.cuda.device_count() - 1}"
    root = Path(__file__).resolve().parent.parent
    res = subprocess.run([sys.executable, "-c", CHILD, str(root), last,
                          str(ctx.out / "runs" / "cuda_n")], capture_output=True, text=True,
                         timeout=max(10.0, min(120.0, ctx.left_s())))
    try:
        out = json.loads(res.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        r.problems.append(f"child failed: {res.stderr[-400:]}")
        return
    r.figures.update(out)
    seen = out.get("seen", {})
    r.claim("cuda_n_no_context_on_0", seen.get(last) is True and seen.get("cuda:0") is False,
            f"pid seen per GPU: {seen}")
    r.claim("cuda_n_nvml_by_uuid", "by UUID" in str(out.get("nvml_match")),
            str(out.get("nvml_match")))
    r.summary = f"{last}: {seen}, NVML {out.get('nvml_match')}"
