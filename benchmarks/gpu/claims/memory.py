"""GPU claims about memory on CUDA: what an OOM leaves behind, allocation history off after a
run, the `m` snapshot and torch's own memory_viz reading it, the --max-memory guard, the
ledger's activation formula, and the report on a CUDA run."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu.device import history_recording, sees_history_when_on
from benchmarks.gpu.registry import Ctx, Outcome, claim

MIB = 1 << 20
ACTIVATION_TOLERANCE = 0.15  # measured saved activations within ±15% of the formula


# ---- an OOM on purpose ------------------------------------------------------------------------
def oom_runs(ctx: Ctx) -> dict[str, Any]:
    """Two runs that run out of memory (the allocator capped at 2 GiB with
    set_per_process_memory_fraction, B=4096): without and with --memory-history."""
    def make() -> dict[str, Any]:
        dev = ctx.torch_device
        total = torch.cuda.get_device_properties(dev).total_memory
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(min(1.0, 2048 * MIB / total), dev)
        out: dict[str, Any] = {}
        try:
            for history in (False, True):
                name = "oom_history" if history else "oom_plain"
                run = ctx.train(name, ctx.config(steps=3, batch_size=4096,
                                                 memory_history=history), timeout_s=120)
                err = run.events("error")
                data = err[0].data if err else {}
                files = [data.get("memory_summary"), data.get("memory_snapshot")]
                present = all(f and (run.run_dir / f).is_file() for f in files)
                entries, load_error = None, None
                if present:
                    try:  # a refusal is a finding of the claims that read entries, not a crash
                        entries = sum(len(t) for t in _load_snapshot(
                            run.run_dir / files[1]).get("device_traces", []))
                    except Exception as exc:
                        load_error = f"{type(exc).__name__}: {exc}"
                out[name] = {"oom": "OutOfMemory" in str(data.get("error_type", "")),
                             "present": present, "trace_entries": entries,
                             "load_error": load_error,
                             "snapshot": str(run.run_dir / files[1]) if present else None,
                             **{k: data.get(k) for k in ("error_type", "memory_summary",
                                                         "memory_snapshot", "memory_snapshot_s",
                                                         "memory_snapshot_kind")}}
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, dev)
            torch.cuda.empty_cache()
        return out

    return ctx.shared("oom", make)


def _load_snapshot(path: Path) -> dict[str, Any]:
    """A snapshot pickle of plain dicts and lists; a pickle that names any class is refused."""
    import pickle

    class Plain(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            raise pickle.UnpicklingError(f"refused: {module}.{name}")

    with open(path, "rb") as fh:
        return Plain(fh).load()


def _oom_text(d: dict[str, Any]) -> str:
    return (f"{d['error_type']}: {d['memory_summary']}, {d['memory_snapshot']} "
            f"({d['memory_snapshot_kind']}), dump {d['memory_snapshot_s']} s, "
            f"{d['trace_entries']} trace entries"
            + (f" (snapshot not read: {d['load_error']})" if d["load_error"] else ""))


@claim(group="oom", needs_s=20, priority=30)
def oom_plain_artifacts(ctx: Ctx) -> Outcome:
    """an OOM writes the error row, memory_summary and a snapshot (no --memory-history)"""
    d = oom_runs(ctx)["oom_plain"]
    return Outcome.check(d["oom"] and d["present"], _oom_text(d), **d)


@claim(group="oom", needs_s=20, priority=30)
def oom_plain_state_only(ctx: Ctx) -> Outcome:
    """without --memory-history the OOM snapshot is state only (no trace entries)"""
    d = oom_runs(ctx)["oom_plain"]
    return Outcome.check(d["trace_entries"] == 0 and "state only" in str(
        d["memory_snapshot_kind"]), _oom_text(d))


@claim(group="oom", needs_s=20, priority=30)
def oom_history_artifacts(ctx: Ctx) -> Outcome:
    """an OOM with --memory-history writes both files, the dump time recorded"""
    d = oom_runs(ctx)["oom_history"]
    return Outcome.check(d["oom"] and d["present"] and d["memory_snapshot_s"] is not None,
                         _oom_text(d), **d)


@claim(group="oom", needs_s=20, priority=30)
def oom_history_has_traces(ctx: Ctx) -> Outcome:
    """with --memory-history the OOM snapshot holds the allocation history"""
    d = oom_runs(ctx)["oom_history"]
    return Outcome.check(bool(d["trace_entries"]), _oom_text(d))


# ---- allocation history off after a run ---------------------------------------------------------


@claim(group="history", needs_s=15, priority=31)
def history_off_after_run(ctx: Ctx) -> Outcome:
    """allocation history is off after a --memory-history run ends (the probe that says so is
    first shown to see history while it is on)"""
    dev = ctx.torch_device
    seen_on, seen_off = sees_history_when_on(dev), history_recording(dev)
    run = ctx.train("history_off", ctx.config(steps=8, memory_history=True))
    after = history_recording(dev)
    started = run.events("run_started")
    state = started[0].data.get("memory_history") if started else None
    ok = seen_on and not seen_off and not after and run.exit_code == 0
    return Outcome.check(ok, f"probe sees history on: {seen_on}, off: {not seen_off}; after the "
                             f"run ({state}): recording {after}")


# ---- the `m` snapshot, the report and the ledger on CUDA ---------------------------------------
def report_run(ctx: Ctx) -> dict[str, Any]:
    """25 steps with a memory_snapshot request (the `m` key) for step 12, then the report."""
    def make() -> dict[str, Any]:
        from probes.analysis.report.build import write_report
        from probes.control.requests import Request, RunControl

        control = RunControl()
        control.submit(Request("memory_snapshot", at_step=12, source="gpu_check"))
        run = ctx.train("report_ledger", ctx.config(steps=25), control=control)
        path = write_report(run.run_dir)
        report = json.loads(path.with_suffix(".json").read_text())
        snaps = run.events("memory_snapshot")
        ledger = run.events("ledger")
        return {"run_dir": str(run.run_dir), "report_md": str(path),
                "results": report.get("results", {}),
                "snapshot": snaps[0].data if snaps else None,
                "snapshot_step": snaps[0].step if snaps else None,
                "ledger_devices": [e.data.get("device") for e in ledger]}

    return ctx.shared("report_ledger", make)


@claim(group="snapshot", needs_s=15, priority=32)
def snapshot_request_state_only(ctx: Ctx) -> Outcome:
    """a memory_snapshot request (the m key) writes a state-only snapshot into the run folder at
    the step asked for"""
    d = report_run(ctx)
    snap = d["snapshot"] or {}
    path = Path(d["run_dir"]) / str(snap.get("path"))
    ok = bool(snap.get("path")) and path.is_file() and snap.get("kind") == "state only" \
        and d["snapshot_step"] == 11
    return Outcome.check(ok, f"event at step {d['snapshot_step']}: {snap}")


def _memory_viz(*args: str) -> subprocess.CompletedProcess[str]:
    """torch's own reader of snapshots, as a user runs it: python -m torch.cuda._memory_viz."""
    return subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", *args],
                          capture_output=True, text=True, timeout=120)


@claim(group="snapshot", needs_s=30, priority=33)
def snapshot_loadable_by_memory_viz(ctx: Ctx) -> Outcome:
    """torch's own memory_viz reader (python -m torch.cuda._memory_viz) reads the m key's
    state-only snapshot (stats) and the OOM snapshot with history (trace_plot, the page
    pytorch.org/memory_viz draws)"""
    d = report_run(ctx)
    state = Path(d["run_dir"]) / str((d["snapshot"] or {}).get("path"))
    history = oom_runs(ctx)["oom_history"]["snapshot"]
    if not state.is_file() or not history:
        return Outcome.check(False, f"no snapshot to read: {state}, {history}")
    stats = _memory_viz("stats", str(state))
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "trace.html"
        plot = _memory_viz("trace_plot", history, "-o", str(html))
        html_bytes = html.stat().st_size if html.is_file() else 0
    ok = stats.returncode == 0 and "segments" in stats.stdout and plot.returncode == 0 \
        and html_bytes > 0
    return Outcome.check(ok, f"stats: exit {stats.returncode}, {stats.stdout[:120]!r}; "
                             f"trace_plot: exit {plot.returncode}, {html_bytes} bytes of html "
                             f"{plot.stderr[-200:]!r}")


@claim(group="report", needs_s=15, priority=32)
def report_on_cuda(ctx: Ctx) -> Outcome:
    """report.md/json are written for a CUDA run, with MFU for a known GPU or the reason there
    is none"""
    d = report_run(ctx)
    res = d["results"]
    ok = Path(d["report_md"]).is_file() and (res.get("mfu") is not None or bool(
        res.get("mfu_note")))
    return Outcome.check(ok, f"mfu {res.get('mfu')}: {res.get('mfu_note')}",
                         mfu=res.get("mfu"), mfu_note=res.get("mfu_note"))


@claim(group="ledger", needs_s=15, priority=32)
def ledger_on_cuda(ctx: Ctx) -> Outcome:
    """the memory ledger measures on the CUDA device"""
    devices = report_run(ctx)["ledger_devices"]
    ok = bool(devices) and all(str(x).startswith("cuda") for x in devices)
    return Outcome.check(ok, f"{len(devices)} ledger events on {sorted(set(map(str, devices)))}")


@claim(group="ledger", needs_s=25, priority=40)
def ledger_activation_line_on_cuda(ctx: Ctx) -> Outcome:
    """the ledger's saved-activation line for memtop's GPT is within ±15% of its formula on CUDA
    fp16 (explicit attention: k=36 B, s=6 B; sdpa: no T² term)"""
    ratios: dict[str, float | None] = {}
    figures: dict[str, Any] = {}
    for attention in ("explicit", "sdpa"):
        run = ctx.train(f"ledger_{attention}", ctx.config(steps=8, amp="fp16",
                                                          attention=attention))
        lines = [ln for e in run.events("ledger") for ln in e.data.get("lines", [])
                 if ln.get("name") == "saved activations"]
        if not lines or not lines[-1].get("predicted_bytes"):
            ratios[attention] = None
            continue
        line = lines[-1]
        ratios[attention] = line["measured_bytes"] / line["predicted_bytes"]
        figures[attention] = {k: line.get(k) for k in ("measured_bytes", "predicted_bytes",
                                                        "formula")}
    ok = all(r is not None and abs(r - 1) <= ACTIVATION_TOLERANCE for r in ratios.values())
    return Outcome.check(ok, "measured / predicted: " + ", ".join(
        f"{k} {v:.3f}" if v is not None else f"{k} no line" for k, v in ratios.items()),
        ratios=ratios, **figures)


# ---- the --max-memory guard -------------------------------------------------------------------
@claim(group="guard", needs_s=25, priority=35)
def memory_guard_stops_before_oom(ctx: Ctx) -> Outcome:
    """--max-memory stops a leaking CUDA run cleanly before its step peak passes the limit: a
    memory_guard row, run_finished naming the guard, no error row"""
    probe = ctx.train("guard_probe", ctx.config(steps=8))
    steady = probe.steps()[-1]
    base = max(steady.step_peak_allocated_bytes or 0, steady.reserved_bytes or 0)
    limit = base + 48 * MIB  # the logits leak keeps ~1 MiB (B×T×V fp16) each step
    run = ctx.train("guard", ctx.config(steps=400, leak="logits", leak_at=8,
                                        max_memory_bytes=limit), timeout_s=120)
    guard = run.events("memory_guard")
    end = run.events("run_finished")
    reason = end[0].data.get("reason") if end else None
    peaks = [s.step_peak_allocated_bytes for s in run.steps()
             if s.step_peak_allocated_bytes is not None]
    ok = (bool(guard) and "memory guard" in str(reason) and not run.events("error")
          and bool(peaks) and max(peaks) <= limit and run.steps()[-1].step < 400)
    return Outcome.check(ok, f"limit {limit / MIB:.0f} MiB (steady {base / MIB:.0f} MiB): "
                             f"guard at step {guard[0].step if guard else None} on "
                             f"{guard[0].data.get('counter') if guard else None}; max step "
                             f"peak {max(peaks, default=0) / MIB:.0f} MiB; ended: {reason}",
                         limit_bytes=limit, max_step_peak_bytes=max(peaks, default=None))
