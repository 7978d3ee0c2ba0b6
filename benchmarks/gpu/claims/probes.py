"""GPU claims about memtop's counters: the allocator figures against torch.cuda.memory_stats()
read at the same moment, the GradScaler's scale and skipped steps, NVML against a fresh read and
nvidia-smi, and the NVML − reserved gap (what a step's sample costs: hotpath.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import weakref
from typing import Any

import torch

from benchmarks.gpu.registry import Ctx, Outcome, claim
from probes.instruments.hooks import StepHook
from probes.records import StepSample

MIB = 1 << 20
PROBE_STEPS = 40
NVML_STEPS = {30, 34, 38}
GAP_RANGE = (64 * MIB, 4096 * MIB)  # CUDA context + cuBLAS/cuDNN workspaces on one process


class InfGrad(StepHook):
    """Makes one parameter's gradient inf during backward on the given steps (a grad hook)."""

    def __init__(self, steps: set[int]) -> None:
        self.steps, self.armed, self.handle = steps, False, None

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
    """An instrument whose ``end_step`` runs on the training thread right after each
    StepSample is taken (not batched: hooks.py): what torch says at that moment
    (memory_stats, the scaler, whether the weights moved), and on NVML steps memtop's poller
    read now beside a fresh NVML read and nvidia-smi.

    Not a sink: a run's rows reach its sinks in batches (probes/runfolder/recorder.py
    publish_soon: every 50 ms or 8 rows), so a sink's "now" is up to 8 steps after its row's
    step. The first H200 run compared from a sink (issue 45): the weights "untouched" on ~4
    of every 5 steps (the rows of a batch after its first saw no step between them), the
    scale unequal after each backoff, allocated unequal on the last rows (published at
    close, after the loop's tensors were freed) and the step peak unequal on the rows of the
    batch published after the warmup reset. On CPU the same hook reads the scaler and the
    weights (tests/unit/test_gpu_check.py)."""

    def __init__(self, is_cuda: bool) -> None:
        self.is_cuda = is_cuda
        self.rows: list[dict[str, Any]] = []
        self.nvml_rows: list[dict[str, Any]] = []
        self._watch: torch.Tensor | None = None
        self._param: torch.Tensor | None = None
        self.trainer: Any = None  # a weakref to the trainer (its Monitor holds the poller)

    def setup(self, ctx) -> None:
        super().setup(ctx)
        # the biggest weight: AdamW (weight decay 0.1) changes it on every step it takes
        self._param = max(ctx.model.parameters(), key=lambda p: p.numel())
        self._watch = self._param.detach().clone()

    def close(self) -> None:
        self._param = self._watch = None

    def end_step(self, step: int, tensors: Any, record: StepSample) -> None:
        if self._param is None:
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
        trainer = self.trainer() if self.trainer is not None else None
        if self.is_cuda and record.step in NVML_STEPS and steady and trainer is not None:
            poller = trainer.monitor.nvml if trainer.monitor is not None else None
            reading = poller.read_once() if poller is not None else None
            self.nvml_rows.append({
                "step": record.step, "reserved": record.reserved_bytes,
                "memtop_process": reading.process_used_bytes if reading else None,
                "memtop_device": reading.device_used_bytes if reading else None,
                "nvml_match": poller.match if poller else None,
                **nvml_truth(self.ctx.device)})


def nvml_truth(device: torch.device) -> dict[str, Any]:
    """This process's GPU memory from a fresh NVML read and from nvidia-smi, now. The NVML
    handle is found by the device's own UUID (GPU- or MIG-), never by an index."""
    from probes.counters.nvml import candidate_uuids

    pid = os.getpid()
    out: dict[str, Any] = {"nvml_fresh": None, "nvml_pids": None, "smi_mib": None}
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
                    break
            if handle is None:
                raise LookupError(f"no NVML device with UUID {uuid}")
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            out["nvml_pids"] = [p.pid for p in procs]
            for proc in procs:
                if proc.pid == pid and proc.usedGpuMemory is not None:
                    out["nvml_fresh"] = int(proc.usedGpuMemory)
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:
        out["nvml_error"] = f"{type(exc).__name__}: {exc}"
    smi = shutil.which("nvidia-smi")
    if smi:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            res = subprocess.run([smi, "--query-compute-apps=pid,used_memory",
                                  "--format=csv,noheader,nounits"], capture_output=True,
                                 text=True, timeout=20)
            pids = {int(a): int(b) for a, b in (
                [p.strip() for p in line.split(",")] for line in res.stdout.splitlines()
                if line.count(",") == 1) if a.isdigit() and b.isdigit()}
            out["smi_pids"], out["smi_mib"] = pids, pids.get(pid)
    return out


def probe_run(ctx: Ctx, amp: str) -> dict[str, Any]:
    """40 steps of memtop's trainer with the ground-truth sink (fp16: inf gradients on two
    steps); plain rows only, the model is gone when this returns."""
    def make() -> dict[str, Any]:
        inject = {15, 25} if amp == "fp16" else set()
        gt = GroundTruth(ctx.is_cuda)
        cfg = ctx.config(amp=amp, steps=PROBE_STEPS)
        run = ctx.train(f"probes_{amp}", cfg, hooks=[gt, InfGrad(inject)],
                        on_trainer=lambda t: setattr(gt, "trainer", weakref.ref(t)))
        return {"rows": gt.rows, "nvml_rows": gt.nvml_rows, "inject": sorted(inject),
                "warmup": cfg.warmup_steps, "exit_code": run.exit_code, "error": run.error}

    return ctx.shared(f"probes_{amp}", make)


def _mismatches(rows: list[dict[str, Any]], warmup: int) -> dict[str, list[int]]:
    """Steps where memtop's figure differs from torch's at the same moment. The step peak is
    compared on every step but the warmup step: memtop reads that step's peak, then resets the
    allocator's peak for the run's peak (probes/monitor/monitor.py), so a read after it sees
    the reset value, not the step's."""
    out = {k: [r["step"] for r in rows if r[k] != r[f"truth_{k}"]]
           for k in ("allocated", "reserved", "alloc_retries", "ooms")}
    out["step_peak"] = [r["step"] for r in rows
                        if r["step"] != warmup and r["step_peak"] != r["truth_step_peak"]]
    return out


@claim(group="probes", needs_s=20, priority=10)
def counters_equal_memory_stats(ctx: Ctx) -> Outcome:
    """allocated, reserved, the step peak, alloc retries and OOMs equal
    torch.cuda.memory_stats() read right after memtop's sample, at every step (the step peak at
    every step but the warmup one, where memtop resets it after reading)"""
    data = probe_run(ctx, "fp16")
    rows = data["rows"]
    if len(rows) != PROBE_STEPS:
        return Outcome.check(False, f"{len(rows)} step samples of {PROBE_STEPS}; "
                                    f"error: {data['error']}")
    bad = _mismatches(rows, data["warmup"])
    detail = "; ".join(f"{k}: {len(rows) - len(v)}/{len(rows)} steps equal"
                       + (f" (differ at {v[:5]})" if v else "") for k, v in bad.items())
    last = rows[-1]
    return Outcome.check(not any(bad.values()), detail, mismatched_steps=bad,
                         last_step_bytes={k: last[k] for k in ("allocated", "reserved", "peak")})


@claim(group="probes", needs_s=20, priority=10)
def run_peak_is_max_of_step_peaks(ctx: Ctx) -> Outcome:
    """the run's peak is the max of the step peaks after warmup"""
    data = probe_run(ctx, "fp16")
    after = [r for r in data["rows"] if r["step"] > data["warmup"]]
    if not after:
        return Outcome.check(False, "no step after warmup")
    want = max(r["step_peak"] for r in after)
    return Outcome.check(after[-1]["peak"] == want,
                         f"run peak {after[-1]['peak']} vs max step peak {want}")


@claim(group="probes", needs_s=20, priority=10)
def scale_and_skipped_steps(ctx: Ctx) -> Outcome:
    """fp16: memtop's scale equals scaler.get_scale() at every step, and the steps it counts as
    skipped are those where the optimizer left the weights untouched (inf gradients injected on
    two steps)"""
    data = probe_run(ctx, "fp16")
    rows, inject = data["rows"], set(data["inject"])
    truth = [r["step"] for r in rows if r["truth_skipped"]]
    counted = [r["step"] for i, r in enumerate(rows)
               if r["skipped_steps"] > (rows[i - 1]["skipped_steps"] if i else 0)]
    scale_ok = all(r["scale"] is not None and r["scale"] == r["truth_scale"] for r in rows)
    ok = scale_ok and inject <= set(truth) and counted == truth and rows[-1][
        "skipped_steps"] == len(truth)
    return Outcome.check(ok, f"scale equal: {scale_ok}; injected {sorted(inject)}, skipped by "
                             f"the optimizer {truth}, counted by memtop {counted}",
                         final_scale=rows[-1]["scale"] if rows else None)


@claim(group="probes", needs_s=20, priority=11)
def bf16_counters_no_scaler(ctx: Ctx) -> Outcome:
    """bf16: the counters equal memory_stats() as for fp16, with no scale and no skipped steps"""
    from trainer.config import bf16_problem

    props = torch.cuda.get_device_properties(ctx.torch_device)
    why = bf16_problem((props.major, props.minor), props.name)
    if why:
        return Outcome.not_run(why)
    data = probe_run(ctx, "bf16")
    rows = data["rows"]
    bad = _mismatches(rows, data["warmup"])
    no_scale = all(r["scale"] is None for r in rows) and rows[-1]["skipped_steps"] == 0
    return Outcome.check(bool(rows) and not any(bad.values()) and no_scale,
                         f"{len(rows)} steps; mismatches {bad}; no scale: {no_scale}")


def _compared(nvml_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in nvml_rows if r["memtop_process"] is not None
            and r["nvml_fresh"] is not None]


@claim(group="nvml", needs_s=20, priority=15)
def nvml_matches_fresh_read(ctx: Ctx) -> Outcome:
    """memtop's NVML process figure (matched by UUID) equals a fresh NVML read within 2 MiB and
    nvidia-smi within 1 MiB, while reserved is steady (NOT RUN when NVML lists no process for
    this pid, as in a sandboxed PID namespace)"""
    rows = probe_run(ctx, "fp16")["nvml_rows"]
    if not rows:
        return Outcome.check(False, "no NVML comparison rows (reserved never steady, no poller)")
    compared = _compared(rows)
    if not compared:
        r = rows[-1]
        return Outcome.not_run(f"NVML lists no process with this pid (pids {r['nvml_pids']}; "
                               f"{r.get('nvml_error') or 'a PID namespace hides it'}): "
                               "nothing to compare", nvml_rows=rows)
    bad = []
    for r in compared:
        if abs(r["memtop_process"] - r["nvml_fresh"]) > 2 * MIB:
            bad.append(f"step {r['step']}: memtop {r['memtop_process']} vs NVML "
                       f"{r['nvml_fresh']}")
        if r.get("smi_mib") is not None and abs(r["nvml_fresh"] / MIB - r["smi_mib"]) > 1:
            bad.append(f"step {r['step']}: NVML {r['nvml_fresh'] / MIB:.1f} MiB vs "
                       f"nvidia-smi {r['smi_mib']} MiB")
    smi = sum(r.get("smi_mib") is not None for r in compared)
    return Outcome.check(not bad, "; ".join(bad) or f"{len(compared)} steps equal (nvidia-smi "
                         f"on {smi}); match: {compared[-1]['nvml_match']}", nvml_rows=rows)


@claim(group="nvml", needs_s=20, priority=15)
def nvml_minus_reserved_gap(ctx: Ctx) -> Outcome:
    """NVML − reserved (CUDA context + libraries, the driver pane's note) lies between 64 MiB
    and 4 GiB and moves by less than 64 MiB across steady steps (the process figure, else the
    device's: the figure README's CUDA table gives)"""
    from probes.counters.cuda_stats import driver_overhead_bytes

    rows = probe_run(ctx, "fp16")["nvml_rows"]
    source = "process" if _compared(rows) else "device"
    gaps = [driver_overhead_bytes(r[f"memtop_{source}"], r["reserved"]) for r in rows]
    gaps = [g for g in gaps if g is not None]
    if not gaps:
        return Outcome.check(False, f"no NVML figure on {len(rows)} steady steps")
    lo, hi = GAP_RANGE
    ok = all(lo < g < hi for g in gaps) and max(gaps) - min(gaps) < 64 * MIB
    return Outcome.check(ok, f"NVML ({source}) − reserved: "
                             f"{', '.join(f'{g / MIB:.0f}' for g in gaps)} MiB",
                         gap_mib=[round(g / MIB, 1) for g in gaps], source=source)
