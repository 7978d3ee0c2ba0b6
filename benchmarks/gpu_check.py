"""GPU check: memtop's probes, profiler window, leak detector, overhead and dashboard on real CUDA.

    python benchmarks/gpu_check.py OUT_DIR [--device cuda|cuda:N] [--budget-s 230]
                                   [--only NAME,...]
    python benchmarks/gpu_check.py OUT_DIR --device cpu     # smoke run of the same code, no GPU

Writes everything into OUT_DIR (created; must be empty or new) and finishes in under 4 minutes on a
CUDA machine: summary.json + summary.md (pass / fail / warn / skip per check, with the figures),
environment.json, the run folders (runs/<check>/...), the profiler window's files and dashboard
SVGs. Needs only a CUDA PyTorch and memtop's own dependencies (textual, textual-plotext, plotext,
nvidia-ml-py); nvidia-smi is used when present. Without CUDA (and no --device cpu) it prints one
line and exits 2, writing nothing. Exit 0 when no check failed, 1 otherwise.

Checks (each is one function below; --device cpu runs what has a meaning on a CPU and marks the
CUDA-only parts "skip"):
  environment      torch / CUDA / driver / GPU, nvidia-smi's view.
  probes_fp16      a short fp16 + GradScaler training through memtop's Trainer: at every step the
                   sampled allocated / reserved / peak equal torch.cuda.memory_stats() read at
                   the same moment (a sink on the training thread, right after the sample);
                   reserved >= allocated, peak >= allocated; the scale equals
                   scaler.get_scale(); gradients made inf on two steps (a grad hook) are counted
                   as skipped, and memtop's skipped-step count equals the ground truth (steps
                   where the optimizer left the weights untouched); NVML process memory (memtop's
                   driver-level sample) vs nvidia-smi --query-compute-apps for this pid.
  probes_bf16      the same for bf16 (no scaler: scale None, 0 skipped).
  profiler_window  --profile-at 8 on the default model: profile_done arrives, the top-ops rows
                   carry device (CUDA) time, non-zero in total, trace.json has kernel events.
  leak_detector    --leak logits (each step's logits kept on the device): a leak_suspected alert
                   on device_allocated within 10 steps, cleared after the fix.
  overhead         benchmarks/overhead.py's plain loop vs headless memtop, 3 interleaved pairs.
  dashboard_svg    MemtopApp (App.run_test, 120x40) over a real CUDA trainer: panes filled,
                   dashboard.svg saved; then p and, when the table arrives, profiler.svg.
  (benchmarks/gpu_check_cuda.py)
  sample_cost      MemoryProbe.begin_step + read (one nested stats dict) vs the three getters.
  sync_count       set_sync_debug_mode("warn") per step: memtop fp16 + fused AdamW vs plain loops
                   (fused / non-fused) as calibration; step_ms against CUDA events.
  oom_capture      an OOM on purpose (allocator capped at 2 GiB), without and with
                   --memory-history: memory_summary, snapshot, dump time, trace entries.
  report_ledger    report.json (MFU or why not) and ledger events on CUDA.
  cuda_n           --device cuda:N in a fresh process: no context on cuda:0, NVML by UUID
                   (NOT RUN with one GPU).
summary.md ends with every CUDA claim as PASS / FAIL / NOT RUN. --dry-run runs no check and writes
that table with every claim NOT RUN (tests/integration/test_gpu_check_dry_run.py runs it on CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
os.environ.setdefault("KINETO_LOG_LEVEL", "5")

import gpu_check_cuda as G  # noqa: E402
import gpu_check_frameworks as F  # noqa: E402
import torch  # noqa: E402
from common import in_thread, median  # noqa: E402  (puts the repo root on sys.path)

from probes.control.requests import RunControl  # noqa: E402
from probes.counters.cuda_stats import driver_overhead_bytes  # noqa: E402
from probes.instruments.hooks import StepHook  # noqa: E402
from probes.monitor import default_hooks  # noqa: E402
from probes.records import Event, StepSample  # noqa: E402
from probes.runfolder import create_run_dir  # noqa: E402
from trainer.config import TrainConfig, bf16_problem  # noqa: E402
from trainer.loop import Trainer  # noqa: E402

MIB = 1024 * 1024
# --device cpu: a smaller model so the smoke run (fp16 autocast is ~30x slower on CPU) is quick
CPU_MODEL = {"layers": 2, "dim": 64, "heads": 2, "batch_size": 8, "seq_len": 64}


@dataclasses.dataclass
class Ctx:
    out: Path
    device: str
    is_cuda: bool
    deadline: float
    log: Callable[[str], None]

    def config(self, **kw: Any) -> TrainConfig:
        base: dict[str, Any] = {"device": self.device, "run_dir": str(self.out / "runs")}
        if not self.is_cuda:
            base.update(CPU_MODEL)
        base.update(kw)
        return TrainConfig(**base)

    def left_s(self) -> float:
        return self.deadline - time.monotonic()


@dataclasses.dataclass
class Result:
    name: str
    status: str = "pass"  # pass | fail | warn | skip
    summary: str = ""
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)
    problems: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    claims: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)

    def claim(self, key: str, ok: bool | None, detail: str = "") -> bool | None:
        """One of CLAIMS[self.name] measured: PASS, FAIL, or (None) NOT RUN with why."""
        status = "NOT RUN" if ok is None else ("PASS" if ok else "FAIL")
        self.claims[key] = {"status": status, "detail": detail}
        if ok is False:
            self.problems.append(f"{key}: {detail}")
        return ok

    def expect(self, ok: bool, what: str) -> bool:
        if not ok:
            self.problems.append(what)
        return ok

    def finish(self) -> Result:
        if self.problems:
            self.status = "fail"
        elif self.warnings and self.status == "pass":
            self.status = "warn"
        return self


# ---- running memtop's trainer -------------------------------------------------------------------

def train(ctx: Ctx, name: str, cfg: TrainConfig, sinks: list | None = None,
          hooks: list[StepHook] | None = None, timeout_s: float = 90.0,
          on_start: Any = None, own_hooks: list[StepHook] | None = None,
          control: RunControl | None = None) -> tuple[Trainer, list]:
    """memtop's Trainer with its own instruments (+ ours) on its thread; returns every record.
    ``on_start.trainer`` is set to the trainer before it starts."""
    root = ctx.out / "runs" / name
    run_dir = create_run_dir(root)
    records: list = []
    trainer = Trainer(cfg, run_dir, control or RunControl(), sinks=[*(sinks or []), records.append],
                      hooks=(own_hooks if own_hooks is not None
                             else default_hooks(**cfg.hook_options())) + list(hooks or []))
    if on_start is not None:
        on_start.trainer = trainer
    trainer.start()
    if not trainer.join(min(timeout_s, max(5.0, ctx.left_s()))):
        trainer.control.stop("gpu_check: time limit")
        trainer.join(30)
        raise TimeoutError(f"{name}: training did not finish in {timeout_s:.0f} s")
    errors = getattr(trainer, "sink_errors", [])
    if errors:  # memtop drops a sink that raises: our ground truth would silently stop
        raise RuntimeError(f"{name}: a check's sink raised on the training thread: {errors}")
    return trainer, records


def events_of(records: list, name: str) -> list[Event]:
    return [r for r in records if isinstance(r, Event) and r.event == name]


def steps_of(records: list) -> list[StepSample]:
    return [r for r in records if isinstance(r, StepSample)]


class InfGrad(StepHook):
    """Makes one parameter's gradient inf during backward on the given steps (a grad hook)."""

    def __init__(self, steps: set[int]) -> None:
        self.steps = steps
        self.armed = False
        self.handle = None

    def setup(self, ctx) -> None:
        super().setup(ctx)
        param = next(p for p in ctx.model.parameters() if p.requires_grad)
        self.handle = param.register_hook(lambda g: g + float("inf") if self.armed else g)

    @contextlib.contextmanager
    def step_context(self, step: int):
        self.armed = step in self.steps
        try:
            yield
        finally:
            self.armed = False

    def close(self) -> None:
        if self.handle is not None:
            self.handle.remove()


class GroundTruth(StepHook):
    """Keeps the RunContext (scaler, model) for the sink, which runs on the training thread right
    after each StepSample is taken and compares it with what torch says at that moment."""

    def __init__(self, is_cuda: bool, nvml_steps: set[int]) -> None:
        self.is_cuda = is_cuda
        self.nvml_steps = nvml_steps
        self.rows: list[dict[str, Any]] = []
        self.nvml_rows: list[dict[str, Any]] = []
        self._watch: torch.Tensor | None = None
        self._param: torch.Tensor | None = None
        self.trainer: Any = None  # set by train(on_start=...): its Monitor holds the poller

    def setup(self, ctx) -> None:
        super().setup(ctx)
        # the biggest weight: AdamW (weight decay 0.1) changes it on every step it takes
        self._param = max(ctx.model.parameters(), key=lambda p: p.numel())
        self._watch = self._param.detach().clone()

    def sink(self, record) -> None:
        if not isinstance(record, StepSample) or self._param is None:
            return
        row: dict[str, Any] = {"step": record.step}
        if self.is_cuda:
            stats = torch.cuda.memory_stats(self.ctx.device)  # the flat dict, as users read it
            row.update(truth_allocated=stats.get("allocated_bytes.all.current"),
                       truth_reserved=stats.get("reserved_bytes.all.current"),
                       truth_step_peak=stats.get("allocated_bytes.all.peak"),
                       truth_alloc_retries=stats.get("num_alloc_retries"),
                       truth_ooms=stats.get("num_ooms"))
        row.update(allocated=record.allocated_bytes, reserved=record.reserved_bytes,
                   peak=record.peak_allocated_bytes, step_peak=record.step_peak_allocated_bytes,
                   alloc_retries=record.alloc_retries, ooms=record.ooms, scale=record.scale,
                   skipped_steps=record.skipped_steps, driver=record.driver_used_bytes)
        scaler = self.ctx.scaler
        row["truth_scale"] = scaler.get_scale() if scaler is not None else None
        now = self._param.detach()
        row["truth_skipped"] = bool(torch.equal(now, self._watch))  # weights untouched
        self._watch = now.clone()
        self.rows.append(row)
        steady = len(self.rows) > 1 and self.rows[-2]["reserved"] == record.reserved_bytes
        if self.is_cuda and record.step in self.nvml_steps and steady:
            # memtop's poller read now (its cached value may predate the cache's growth), and
            # an independent NVML read and nvidia-smi right after, while reserved is steady
            mon = self.trainer.monitor if self.trainer is not None else None
            poller = mon.nvml if mon is not None else None
            reading = poller.read_once() if poller is not None else None
            self.nvml_rows.append({"step": record.step, "reserved": record.reserved_bytes,
                                   "memtop_driver": reading.driver_bytes if reading else None,
                                   "memtop_cached": record.driver_used_bytes,
                                   "nvml_match": poller.match if poller else None,
                                   **nvml_truth(self.ctx.device)})


def nvml_truth(device: torch.device) -> dict[str, Any]:
    """This process's GPU memory from a fresh NVML read and from nvidia-smi, now. The NVML
    handle is found by the device's own UUID (GPU- or MIG-); never by an index, which CUDA and
    NVML number differently (CUDA_VISIBLE_DEVICES, device order)."""
    from probes.counters.nvml import candidate_uuids

    pid = os.getpid()
    out: dict[str, Any] = {"nvml_fresh": None, "smi_mib": None, "smi_pids": None}
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            idx = device.index if device.index is not None else torch.cuda.current_device()
            uuid = str(torch.cuda.get_device_properties(idx).uuid)
            handle = None
            for text in candidate_uuids(uuid):
                with contextlib.suppress(Exception):
                    handle = pynvml.nvmlDeviceGetHandleByUUID(text)
                    out["nvml_uuid"] = text
                    break
            if handle is None:
                raise LookupError(f"no NVML device with UUID {uuid}")
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == pid and proc.usedGpuMemory is not None:
                    out["nvml_fresh"] = int(proc.usedGpuMemory)
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:
        out["nvml_error"] = f"{type(exc).__name__}: {exc}"
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            res = subprocess.run([smi, "--query-compute-apps=pid,used_memory",
                                  "--format=csv,noheader,nounits"], capture_output=True,
                                 text=True, timeout=20)
            pids = {}
            for line in res.stdout.splitlines():
                parts = [p.strip() for p in line.split(",")]
                if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                    pids[int(parts[0])] = int(parts[1])
            out["smi_pids"] = pids
            out["smi_mib"] = pids.get(pid)
        except (OSError, subprocess.SubprocessError) as exc:
            out["smi_error"] = str(exc)
    else:
        out["smi_error"] = "nvidia-smi not found"
    return out


# ---- the checks ---------------------------------------------------------------------------------

def check_environment(ctx: Ctx, r: Result) -> None:
    env: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__,
        "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
        "host": platform.node(), "cpu_count": os.cpu_count(), "device": ctx.device,
    }
    for mod in ("textual", "textual_plotext", "plotext", "pynvml"):
        try:
            m = __import__(mod)
            env[mod] = getattr(m, "__version__", "present")
        except Exception as exc:
            env[mod] = f"missing: {exc}"
    if ctx.is_cuda:
        dev = torch.device(ctx.device)
        props = torch.cuda.get_device_properties(dev)
        env.update(gpu=props.name, capability=f"{props.major}.{props.minor}",
                   gpu_total_bytes=props.total_memory,
                   bf16=bf16_problem((props.major, props.minor), props.name) is None,
                   device_count=torch.cuda.device_count(),
                   cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
        smi = shutil.which("nvidia-smi")
        if smi:
            res = subprocess.run([smi, "--query-gpu=index,name,driver_version,memory.total,"
                                  "memory.used", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            env["nvidia_smi"] = res.stdout.strip() or res.stderr.strip()
        else:
            r.warnings.append("nvidia-smi not on PATH")
        r.summary = f"{env['gpu']} (sm {env['capability']}), torch {torch.__version__}, " \
                    f"CUDA {torch.version.cuda}"
    else:
        r.status = "skip"
        r.summary = f"CPU smoke run: torch {torch.__version__}, no CUDA checks"
    if str(env.get("pynvml", "")).startswith("missing"):
        (r.warnings if ctx.is_cuda else r.skipped).append("pynvml missing: driver pane n/a")
    r.figures = env
    (ctx.out / "environment.json").write_text(json.dumps(env, indent=2, default=str) + "\n")


def _probe_check(ctx: Ctx, r: Result, amp: str) -> None:
    if ctx.is_cuda and amp == "bf16":
        props = torch.cuda.get_device_properties(torch.device(ctx.device))
        why = bf16_problem((props.major, props.minor), props.name)
        if why:
            r.status, r.summary = "skip", why
            return
    steps = 40
    inject = {15, 25} if amp == "fp16" else set()
    gt = GroundTruth(ctx.is_cuda, nvml_steps={30, 34, 38})
    cfg = ctx.config(amp=amp, steps=steps)
    trainer, records = train(ctx, f"probes_{amp}", cfg, sinks=[gt.sink],
                             hooks=[gt, InfGrad(inject)], on_start=gt)
    rows = gt.rows
    r.expect(trainer.exit_code == 0, f"trainer exit code {trainer.exit_code}: "
             f"{trainer.status.error}")
    r.expect(len(rows) == steps, f"{len(rows)} step samples, expected {steps}")
    if ctx.is_cuda:
        mism = {k: [row["step"] for row in rows if row[k] != row[f"truth_{k}"]]
                for k in ("allocated", "reserved", "step_peak", "alloc_retries", "ooms")}
        r.claim("counters_equal_memory_stats", not any(mism.values()), "; ".join(
            f"{k}: {len(rows) - len(v)}/{len(rows)} steps" for k, v in mism.items()))
        r.figures["counters_equal_memory_stats"] = {
            k: f"{len(rows) - len(v)}/{len(rows)} steps" for k, v in mism.items()}
        after = [row for row in rows if row["step"] > cfg.warmup_steps]
        run_peak = max((row["step_peak"] for row in after), default=None)
        r.claim("run_peak_is_max_of_step_peaks", not after or after[-1]["peak"] == run_peak,
                f"run peak {after[-1]['peak'] if after else None} vs max step peak {run_peak}")
        last = rows[-1]
        r.figures["last_step_bytes"] = {k: last[k] for k in ("allocated", "reserved", "peak")}
    else:
        r.skipped.append("counters vs torch.cuda.memory_stats (CUDA only)")
    r.expect(all(row["reserved"] >= row["allocated"] for row in rows), "reserved < allocated")
    r.expect(all(row["peak"] >= row["allocated"] for row in rows), "peak < allocated")
    if amp == "fp16":
        r.expect(all(row["scale"] is not None for row in rows), "scale missing on some steps")
        r.expect(all(row["scale"] == row["truth_scale"] for row in rows),
                 "scale differs from scaler.get_scale()")
        truth = [row["step"] for row in rows if row["truth_skipped"]]
        counted = [row["step"] for i, row in enumerate(rows)
                   if row["skipped_steps"] > (rows[i - 1]["skipped_steps"] if i else 0)]
        r.expect(inject <= set(truth), f"injected inf steps {sorted(inject)} not all skipped "
                                       f"by the optimizer (weights changed): {truth}")
        r.expect(counted == truth, f"memtop counted skipped steps {counted}, ground truth "
                                   f"(weights untouched) {truth}")
        r.expect(rows[-1]["skipped_steps"] == len(truth),
                 f"skipped_steps {rows[-1]['skipped_steps']} != {len(truth)}")
        r.figures.update(injected_inf_steps=sorted(inject), skipped_truth=truth,
                         skipped_memtop=counted, final_scale=rows[-1]["scale"])
    else:
        r.expect(all(row["scale"] is None for row in rows), "a scale without a GradScaler")
        r.expect(rows[-1]["skipped_steps"] == 0, "skipped steps without a GradScaler")
        r.figures["scale"] = "None on every step (no scaler)"
    if ctx.is_cuda:
        _nvml_part(r, gt.nvml_rows)
        r.claim("nvml_matches_fresh_read", not any("NVML" in p for p in r.problems)
                and bool(gt.nvml_rows), r.figures.get("nvml", "no rows"))
    else:
        r.skipped.append("NVML vs nvidia-smi (CUDA only)")
    r.summary = f"{len(rows)} steps; " + "; ".join(
        f"{k}: {v}" for k, v in r.figures.items()
        if k in ("counters_equal_memory_stats", "skipped_memtop", "skipped_truth", "scale",
                 "final_scale", "nvml"))


def _nvml_part(r: Result, rows: list[dict[str, Any]]) -> None:
    r.figures["nvml_rows"] = rows
    if not rows:
        r.problems.append("no NVML comparison rows")
        return
    notes = []
    for row in rows:
        memtop, fresh, smi = row["memtop_driver"], row["nvml_fresh"], row["smi_mib"]
        if memtop is None:
            r.warnings.append(f"step {row['step']}: memtop's driver-level value is n/a "
                              f"({row.get('nvml_error') or 'NVML lists no process with this pid'}"
                              "; a container's PID namespace does this)")
            continue
        r.expect(memtop >= row["reserved"], f"step {row['step']}: NVML process memory "
                 f"{memtop} < reserved {row['reserved']}")
        if fresh is not None:
            r.expect(abs(memtop - fresh) <= max(2 * MIB, 0.02 * fresh),
                     f"step {row['step']}: memtop NVML {memtop} vs fresh NVML {fresh}")
        if smi is not None and fresh is not None:
            r.expect(abs(fresh / MIB - smi) <= 1.0,
                     f"step {row['step']}: NVML {fresh / MIB:.1f} MiB vs nvidia-smi {smi} MiB")
            notes.append(f"step {row['step']}: memtop {memtop / MIB:.0f} MiB, NVML "
                         f"{fresh / MIB:.0f} MiB, nvidia-smi {smi} MiB; NVML − reserved "
                         f"(context + non-PyTorch) "
                         f"{driver_overhead_bytes(memtop, row['reserved']) / MIB:.0f} MiB")
        elif smi is None:
            r.warnings.append(f"step {row['step']}: nvidia-smi lists no process with this pid "
                              f"({row.get('smi_error') or row.get('smi_pids')})")
    r.figures["nvml"] = notes[-1] if notes else "not compared"


def check_probes_fp16(ctx: Ctx, r: Result) -> None:
    _probe_check(ctx, r, "fp16")


def check_probes_bf16(ctx: Ctx, r: Result) -> None:
    _probe_check(ctx, r, "bf16")


def check_profiler_window(ctx: Ctx, r: Result) -> None:
    cfg = ctx.config(steps=22, profile_at=[8])
    hooks = default_hooks(**cfg.hook_options())
    window = next(h for h in hooks if hasattr(h, "open_window"))
    window.keep_profiler = True  # torch's own key_averages() of the same window, to compare
    trainer, records = train(ctx, "profiler_window", cfg, timeout_s=150, own_hooks=hooks)
    done = events_of(records, "profile_done")
    if not r.expect(len(done) == 1, f"profile_done events: {len(done)}; cancelled: "
                    f"{[e.data.get('reason') for e in events_of(records, 'profile_cancelled')]}"):
        return
    d = done[0].data
    rows = d.get("top_ops") or []
    r.expect(bool(rows), "empty top-ops table")
    out_dir = trainer.run_dir / d["dir"]
    shutil.copytree(out_dir, ctx.out / "profiler_window", dirs_exist_ok=True)
    r.expect(sum(row.get("self_cpu_us") or 0 for row in rows) > 0, "no CPU time in the table")
    trace = json.loads((out_dir / d.get("trace", "trace.json")).read_text())
    events = trace.get("traceEvents", [])
    r.expect(bool(events), "trace.json has no traceEvents")
    cats: dict[str, int] = {}
    for e in events:
        cats[str(e.get("cat"))] = cats.get(str(e.get("cat")), 0) + 1
    r.figures.update(rows=len(rows), trace_events=len(events), sort_by=d.get("sort_by"),
                     analysis_s=d.get("analysis_s"), wall_s=d.get("wall_s"),
                     top3=[row["name"] for row in rows[:3]])
    if ctx.is_cuda:
        with_dev = [row for row in rows if row.get("self_device_us") is not None]
        dev_total = sum(row.get("self_device_us") or 0 for row in rows)
        r.expect(len(with_dev) == len(rows), "rows without the device-time column")
        r.expect(dev_total > 0, "total device time is zero")
        r.expect(cats.get("kernel", 0) > 0, f"no kernel events in trace.json ({cats})")
        r.expect(d.get("sort_by") == "device", f"sorted by {d.get('sort_by')}, not device")
        r.figures.update(self_device_ms_total=dev_total / 1000, kernel_events=cats.get("kernel"))
        _compare_key_averages(r, out_dir / d.get("trace", "trace.json"), window, rows)
        r.summary = (f"{len(rows)} rows, device time {dev_total / 1000:.1f} ms in all, "
                     f"{cats.get('kernel', 0)} kernel events; top: {r.figures['top3']}")
    else:
        r.skipped.append("CUDA columns (CUDA only)")
        r.summary = f"{len(rows)} rows (CPU time); top: {r.figures['top3']}"


def _compare_key_averages(r: Result, trace_path: Path, window: Any, rows: list) -> None:
    """memtop's table from trace.json against torch's key_averages() of the same window."""
    from probes.traces.chrome_trace import aggregate, load_trace

    prof = window.last_profiler
    if prof is None:
        r.claim("ops_table_equals_key_averages", None, "the window kept no profiler")
        return
    theirs = {e.key: e for e in in_thread(prof.key_averages)}
    ours = aggregate(load_trace(trace_path), use_device=True)
    bad = []
    for row in ours:
        ref = theirs.get(row["name"])
        if ref is None or row["calls"] != ref.count or abs(
                row["self_device_us"] - ref.self_device_time_total) > max(
                1.0, 0.01 * ref.self_device_time_total):
            bad.append(row["name"])
    r.claim("ops_table_equals_key_averages", not bad and len(ours) == len(theirs),
            f"{len(ours)} rows vs {len(theirs)}; differing: {bad[:6]}")
    ranked = [e.key for e in sorted(theirs.values(), key=lambda e: -e.self_device_time_total)
              if not e.is_user_annotation][:10]
    ann = [row["name"] for row in rows if row.get("user_annotation")]
    r.claim("no_annotation_in_device_ranking", not ann and rows[0]["name"] in ranked[:3],
            f"memtop top: {[row['name'] for row in rows[:3]]}; torch top ops: {ranked[:3]}")


def check_leak_detector(ctx: Ctx, r: Result) -> None:
    start, stop, steps = 20, 45, 70
    cfg = ctx.config(steps=steps, leak="logits", leak_at=start, leak_stop_at=stop)
    trainer, records = train(ctx, "leak_detector", cfg, timeout_s=120)
    want = "device_allocated" if ctx.is_cuda else "host_heap"
    alerts = events_of(records, "leak_suspected")
    cleared = events_of(records, "leak_cleared")
    mine = [e for e in alerts if e.data.get("counter") == want]
    r.figures.update(alerts=[(e.step, e.data.get("counter"), e.data.get("bytes_per_step"),
                              e.data.get("likely_cause")) for e in alerts],
                     cleared=[(e.step, e.data.get("counter")) for e in cleared])
    if not r.expect(bool(mine), f"no leak_suspected on {want} (alerts: {r.figures['alerts']})"):
        return
    first = mine[0]
    delay = first.step - start
    r.expect(delay <= 10, f"alert {delay} steps after the leak began (want ≤ 10)")
    expected = cfg.batch_size * cfg.seq_len * 256 * (2 if cfg.amp_mode in ("fp16", "bf16")
                                                     else 4)
    per_step = first.data.get("bytes_per_step") or 0
    r.figures.update(alert_after_steps=delay, bytes_per_step=per_step,
                     logits_bytes_expected=expected)
    if ctx.is_cuda:
        r.expect(0.5 * expected <= per_step <= 2.0 * expected,
                 f"{per_step} B/step on the device, logits are ~{expected} B")
    done = [e for e in cleared if e.data.get("counter") == want and e.step >= stop]
    r.expect(bool(done), f"alert on {want} not cleared after the fix at step {stop}")
    if done:
        r.figures["cleared_after_steps"] = done[0].step - stop
    r.summary = (f"{want} alert {delay} steps after the leak began, {per_step} B/step "
                 f"(logits ~{expected} B), cleared "
                 f"{r.figures.get('cleared_after_steps', '?')} steps after the fix")


def check_overhead(ctx: Ctx, r: Result) -> None:
    from overhead import memtop_headless, plain_loop

    cfg = ctx.config()
    hist_cfg = dataclasses.replace(cfg, memory_history=True)
    warm, steps = (20, 200) if ctx.is_cuda else (5, 30)
    plain, ours, hist = [], [], []
    history_left_on = []
    for _ in range(3):
        if ctx.left_s() < 20:
            r.warnings.append("time budget: fewer repeats")
            break
        plain.append(in_thread(plain_loop, cfg, warm, steps))
        ours.append(in_thread(memtop_headless, cfg, warm, steps))
        if ctx.is_cuda:  # the same with --memory-history: what allocation history costs
            hist.append(in_thread(memtop_headless, hist_cfg, warm, steps))
            history_left_on.append(history_recording())
    if not r.expect(bool(plain), "no repeat ran"):
        return
    ratio = median(ours) / median(plain)
    r.figures.update(plain_tokens_per_s=plain, memtop_tokens_per_s=ours, ratio=ratio,
                     warm=warm, steps=steps, amp=cfg.amp_mode)
    if hist:
        r.figures.update(history_tokens_per_s=hist, history_ratio=median(hist) / median(ours))
        r.claim("history_off_after_run", not any(history_left_on),
                f"recording after each --memory-history run: {history_left_on}")
    if ratio < 0.99:
        r.warnings.append(f"ratio {ratio:.3f} < 0.99 (the CPU target; a short run, see figures)")
    r.summary = (f"plain {median(plain):,.0f} tok/s, memtop headless {median(ours):,.0f} tok/s,"
                 f" ratio {ratio:.3f} ({len(plain)} pairs, {steps} steps each)")


def history_recording() -> bool:
    """Whether the allocator still records history: allocate an odd size and look for that
    allocation among the last trace entries (the ring buffer may be full, so counts won't do)."""
    probe = torch.empty(1_234_567, dtype=torch.uint8, device="cuda")
    ptr = probe.untyped_storage().data_ptr()
    traces = torch.cuda.memory._snapshot()["device_traces"]
    del probe
    return any(e.get("action") == "alloc" and e.get("addr") == ptr
               and e.get("size") == 1_234_944 for t in traces for e in t[-64:])


def check_dashboard_svg(ctx: Ctx, r: Result) -> None:
    asyncio.run(_dashboard(ctx, r))


async def _dashboard(ctx: Ctx, r: Result) -> None:
    from tui.app import MemtopApp

    cfg = ctx.config(steps=0)
    run_dir = create_run_dir(ctx.out / "runs" / "dashboard")
    app = MemtopApp.for_run(cfg, run_dir, freeze_gc=False)

    async def wait_for(pilot, cond, timeout_s: float) -> bool:
        t0 = time.monotonic()
        while not cond():
            if time.monotonic() - t0 > min(timeout_s, max(1.0, ctx.left_s() - 5)):
                return False
            await pilot.pause(0.2)
        return True

    async with app.run_test(size=(120, 40)) as pilot:
        ok = await wait_for(pilot, lambda: app.trainer.status.step >= 30
                            or app.trainer.status.state == "failed", 90)
        r.expect(ok and app.trainer.status.state != "failed",
                 f"dashboard trainer: state {app.trainer.status.state}, step "
                 f"{app.trainer.status.step}, error {app.trainer.status.error}")
        if ok:
            app.redraw_chart()
            ticks = app.ticks
            await wait_for(pilot, lambda: app.ticks >= ticks + 2, 10)
            await pilot.pause(0.3)
            path = app.save_screenshot(filename="dashboard.svg", path=str(ctx.out))
            r.figures["dashboard_svg"] = str(path)
            panes = {k: p.top_text for k, p in app.panes.items()}
            r.figures.update(header=app.header_bar.text, panes=panes)
            r.expect("n/a" not in panes["allocated"], f"allocated pane: {panes['allocated']}")
            if ctx.is_cuda:
                name = torch.cuda.get_device_name(torch.device(ctx.device))
                r.expect(name.split()[-1] in app.header_bar.text,
                         f"GPU name not in the header: {app.header_bar.text}")
                if "n/a" in panes["driver"]:
                    r.warnings.append(f"driver-level pane n/a (NVML): {panes['driver']}")
                r.expect("no scaler" not in panes["scale"], f"scale pane: {panes['scale']}")
            await pilot.press("p")
            if await wait_for(pilot, lambda: bool(app.ops_table.ops), 60):
                app.clear_notifications()
                await pilot.pause(0.6)
                path = app.save_screenshot(filename="profiler.svg", path=str(ctx.out))
                r.figures["profiler_svg"] = str(path)
            else:
                r.warnings.append("no top-ops table within the time left: no profiler.svg")
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_code is not None, 60)
    app.shutdown(timeout_s=30)
    r.expect(not app.trainer.alive, "the trainer thread is still alive after q")
    r.summary = (f"dashboard.svg{' + profiler.svg' if 'profiler_svg' in r.figures else ''}; "
                 f"header: {r.figures.get('header', '?').strip()}")


CHECKS: list[tuple[str, Callable[[Ctx, Result], None], float]] = [
    # name, function, seconds it needs at least (else skipped for the time budget)
    ("environment", check_environment, 1),
    ("probes_fp16", check_probes_fp16, 15),
    ("sample_cost", G.check_sample_cost, 2),
    ("sync_count", G.check_sync_count, 15),
    ("oom_capture", G.check_oom_capture, 15),
    ("probes_bf16", check_probes_bf16, 15),
    ("profiler_window", check_profiler_window, 25),
    ("report_ledger", G.check_report_ledger, 10),
    ("leak_detector", check_leak_detector, 20),
    ("cuda_n", G.check_cuda_n, 20),
    ("overhead", check_overhead, 30),
    ("dashboard_svg", check_dashboard_svg, 30),
    ("frameworks", F.check_frameworks, 40),
]
# What each check proves on a GPU, listed in summary.md as PASS / FAIL / NOT RUN.
CLAIMS: dict[str, list[tuple[str, str]]] = {
    "probes_fp16": [
        ("counters_equal_memory_stats", "allocated, reserved, step peak, alloc retries and OOMs "
         "equal torch.cuda.memory_stats() at every step (one nested read per step)"),
        ("run_peak_is_max_of_step_peaks", "the run's peak is the max of the per-step peaks"),
        ("nvml_matches_fresh_read", "memtop's NVML read (matched by UUID) equals a fresh NVML "
         "read and nvidia-smi while reserved is steady")],
    "sample_cost": [("sample_cost", "the per-step memory sample costs <= 20 µs on CUDA")],
    "sync_count": [
        ("sync_counting_works", "set_sync_debug_mode counts one more sync per step for a "
         "non-fused AdamW under GradScaler than for a fused one"),
        ("one_sync_per_step", "memtop's fp16 trainer (fused AdamW) syncs once per step"),
        ("step_time_matches_cuda_events", "step_ms agrees with CUDA events within 10%")],
    "oom_capture": [
        ("oom_plain_artifacts", "an OOM writes memory_summary and a snapshot (no history)"),
        ("oom_plain_state_only", "without --memory-history the snapshot is state only"),
        ("oom_history_artifacts", "an OOM with --memory-history writes both, dump time kept"),
        ("oom_history_has_traces", "with --memory-history the snapshot holds the history")],
    "profiler_window": [
        ("ops_table_equals_key_averages", "the top-ops table from trace.json equals torch's "
         "key_averages() on a real CUDA trace (calls, self device time)"),
        ("no_annotation_in_device_ranking", "ProfilerStep#/forward/backward/optimizer spans are "
         "out of the device ranking, and its top op is among torch's top 3")],
    "report_ledger": [
        ("report_written", "report.md/json are written for a CUDA run"),
        ("ledger_on_cuda", "the ledger measures on the CUDA device"),
        ("mfu_or_reason", "MFU is computed for a known GPU, or the report says why not"),
        ("snapshot_request", "a memory_snapshot request (the m key) writes a state-only "
         "snapshot into the run folder at the step asked for")],
    "cuda_n": [
        ("cuda_n_no_context_on_0", "--device cuda:N creates no CUDA context on cuda:0"),
        ("cuda_n_nvml_by_uuid", "NVML is matched to cuda:N by UUID")],
    "overhead": [("history_off_after_run", "allocation history is off after a "
                  "--memory-history run ends (the next run does not pay for it)")],
    "frameworks": [
        ("hf_rows_on_cuda", "HF Trainer fp16 on CUDA with MemtopCallback: one row per "
         "optimizer step, 2 micro-batches each, amp fp16 with accelerate's GradScaler scale"),
        ("hf_bf16_no_added_sync", "in bf16 the HF callback adds no device sync per step to "
         "the same Trainer's own"),
        ("hf_fp16_one_sync_at_most", "in fp16 the HF callback adds at most one sync per step "
         "(the GradScaler's scale, read at the step's end)"),
        ("lightning_16_mixed_rows", "Lightning 16-mixed on CUDA with MemtopCallback: one row "
         "per optimizer step with the GradScaler's scale, fit() ends normally")],
}


def claim_rows(results: list[Result]) -> list[tuple[str, str, str, str]]:
    """(check, claim, status, detail) for every declared claim; NOT RUN where no check
    measured it (CPU, time budget, one GPU)."""
    by_name = {r.name: r for r in results}
    rows = []
    for check, claims in CLAIMS.items():
        r = by_name.get(check)
        for key, text in claims:
            got = r.claims.get(key) if r is not None else None
            if got is None:
                why = "check not run" if r is None else (r.summary or r.status)
                rows.append((check, text, "NOT RUN", why))
            else:
                rows.append((check, text, got["status"], got["detail"]))
    return rows


# ---- main ---------------------------------------------------------------------------------------

def write_summary(ctx: Ctx, results: list[Result], started: float) -> int:
    failed = [r.name for r in results if r.status == "fail"]
    data = {"device": ctx.device, "started_utc": time.strftime("%Y-%m-%d %H:%M:%S",
                                                               time.gmtime(started)),
            "seconds": round(time.time() - started, 1), "ok": not failed,
            "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
            "checks": [dataclasses.asdict(r) for r in results]}
    (ctx.out / "summary.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    env = next((r.figures for r in results if r.name == "environment"), {})
    lines = [f"# memtop GPU check ({data['started_utc']} UTC, {data['seconds']} s)", "",
             f"Device: {env.get('gpu', ctx.device)}; torch {torch.__version__}, CUDA "
             f"{torch.version.cuda}; `{data['command']}`", "",
             "| check | status | figures | problems / warnings / skipped |", "|---|---|---|---|"]
    for r in results:
        notes = "; ".join([*(f"FAIL: {p}" for p in r.problems),
                           *(f"warn: {w}" for w in r.warnings),
                           *(f"skip: {s}" for s in r.skipped)])
        lines.append(f"| {r.name} | **{r.status}** | {r.summary.replace('|', '/')} | "
                     f"{notes.replace('|', '/')} |")
    lines += ["", "## Claims", "", "| check | claim | status | detail |",
              "|---|---|---|---|"]
    for check, text, status, detail in claim_rows(results):
        lines.append(f"| {check} | {text.replace('|', '/')} | **{status}** | "
                     f"{str(detail).replace('|', '/')[:300]} |")
    overall = "all checks passed" if not failed else "FAILED: " + ", ".join(failed)
    if all(r.status == "skip" for r in results):
        overall = "nothing measured (every check skipped)"
    lines += ["", f"Overall: {overall} (warn = passed with a caveat; skip = not meaningful "
                  "here)."]
    (ctx.out / "summary.md").write_text("\n".join(lines) + "\n")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="output folder (created; must be new or empty)")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (smoke run)")
    parser.add_argument("--budget-s", type=float, default=230.0,
                        help="stop starting checks after this many seconds")
    parser.add_argument("--only", default="", help="comma-separated check names")
    parser.add_argument("--dry-run", action="store_true",
                        help="run no check: write the summary with every claim NOT RUN (tests "
                             "that the script imports and reports, on any machine)")
    args = parser.parse_args(argv)
    is_cuda = args.device.startswith("cuda")
    if args.dry_run:
        args.out.mkdir(parents=True, exist_ok=True)
        ctx = Ctx(args.out, args.device, is_cuda, time.monotonic(), print)
        results = [Result(name, status="skip", summary="dry run") for name, _, _ in CHECKS]
        write_summary(ctx, results, time.time())
        return 0
    if is_cuda and not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device here (torch {torch.__version__}, "
              f"torch.cuda.is_available() is False): nothing measured, nothing written; run it "
              f"on a CUDA machine, or pass --device cpu for a smoke run", file=sys.stderr)
        return 2
    if args.out.exists() and any(args.out.iterdir()):
        print(f"gpu_check: {args.out} is not empty; give a new folder", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = {n for n in args.only.split(",") if n}
    unknown = wanted - {name for name, _, _ in CHECKS}
    if unknown:
        print(f"gpu_check: unknown check(s) {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    log_fh = open(args.out / "gpu_check.log", "w", encoding="utf-8")

    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        log_fh.write(line + "\n")
        log_fh.flush()

    started = time.time()
    ctx = Ctx(args.out, args.device, is_cuda, time.monotonic() + args.budget_s, log)
    results: list[Result] = []
    for name, fn, need_s in CHECKS:
        if wanted and name not in wanted and name != "environment":
            continue
        r = Result(name)
        if ctx.left_s() < need_s:
            r.status, r.summary = "skip", f"time budget ({args.budget_s:.0f} s) spent"
            results.append(r)
            log(f"{name}: skip (time budget)")
            continue
        t0 = time.monotonic()
        log(f"{name} ...")
        try:
            fn(ctx, r)
        except Exception as exc:
            r.problems.append(f"{type(exc).__name__}: {exc}")
            r.figures["traceback"] = traceback.format_exc()
        r.seconds = round(time.monotonic() - t0, 1)
        r.finish()
        results.append(r)
        log(f"{name}: {r.status} ({r.seconds} s) {r.summary}")
        for p in r.problems:
            log(f"  FAIL {p}")
        for w in r.warnings:
            log(f"  warn {w}")
        write_summary(ctx, results, started)  # partial results survive a kill
    code = write_summary(ctx, results, started)
    log(f"done in {time.time() - started:.0f} s: {args.out / 'summary.md'}")
    log_fh.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
