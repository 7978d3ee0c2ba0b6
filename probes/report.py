"""The experiment report (tutorial §6.3): report.json + report.md, built from a run folder's files.

Only files are read (config.json, metrics.jsonl), never torch, so it runs from any thread and on
a machine other than the one that trained. A killed run still gets a report from the rows that
exist, marked incomplete; a folder that is not a run raises ReportError and nothing is written.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any

from probes.report_read import (
    LEAK_EVENTS,
    ReportError,
    finite_num,
    is_int,
    read_config,
    read_rows,
)
from probes.report_text import finding, render_markdown
from probes.runfolder import write_json
from probes.sysinfo import host_info

REPORT_VERSION = 1
SYNC_RULE = ("one blocking host sync per step, at loss.item(); the grad norm and the GradScaler "
             "scale are read after it (already computed); with fp16 on CUDA, GradScaler.step also "
             "syncs to check for inf/nan gradients; no explicit synchronize")
# Dense peak FLOP/s from vendor datasheets (no sparsity): (name pattern, {compute dtype: FLOP/s}).
# fp32 means plain FP32 (torch leaves TF32 matmuls off by default).
PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    (r"H100.*PCIe", {"bf16": 756e12, "fp16": 756e12, "fp32": 51e12}),
    # H100 NVL and H200 NVL share the lower-clocked figures; before the SXM/GH200 catch-all.
    (r"H[12]00.*NVL", {"bf16": 835e12, "fp16": 835e12, "fp32": 60e12}),
    (r"H100|H200|GH200", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
    (r"A100", {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}),
    (r"L40S", {"bf16": 362e12, "fp16": 362e12, "fp32": 91.6e12}),
    (r"\bL4\b", {"bf16": 121e12, "fp16": 121e12, "fp32": 30.3e12}),
    (r"\bA10\b", {"bf16": 125e12, "fp16": 125e12, "fp32": 31.2e12}),
    (r"RTX 4090", {"bf16": 165e12, "fp16": 165e12, "fp32": 82.6e12}),
    (r"V100", {"fp16": 125e12, "fp32": 15.7e12}),
    (r"\bT4\b", {"fp16": 65e12, "fp32": 8.1e12}),
)


# One writer at a time: `r` twice, `r` then `q`, or the quit thread and shutdown() after a forced
# quit would otherwise build and replace report.json/report.md from two threads at once.
_WRITE_LOCK = threading.Lock()


# building -----------------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); p50 is the median."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


# building ----------------------------------------------------------------------------------------
def peak_flops(device_name: str | None, amp: str) -> tuple[float | None, str]:
    """(peak FLOP/s, why) for the device and compute dtype; None where memtop has no figure."""
    if not device_name or device_name.upper() == "CPU":
        return None, ("CPU peak FLOP/s depends on cores, clocks and vector units; memtop keeps "
                      "no table for CPUs, so MFU is not computed (achieved FLOP/s is)")
    dtype = amp if amp in ("bf16", "fp16") else "fp32"
    for pattern, table in PEAK_FLOPS:
        if re.search(pattern, device_name, re.IGNORECASE):
            if dtype in table:
                return table[dtype], f"{device_name}: {table[dtype] / 1e12:g} TFLOP/s {dtype} dense"
            return None, f"{device_name} has no {dtype} tensor-core figure in memtop's table"
    return None, f"peak FLOP/s of {device_name!r} is not in memtop's table"


def _flops_per_token(config: dict[str, Any], params: int | None) -> dict[str, Any] | None:
    """nanoGPT's estimate: 6N + 12·L·D·T, N without the position table (block_size × D)."""
    if not params:
        return None
    L, D, T = config["layers"], config["dim"], config["seq_len"]
    block = config.get("block_size") if is_int(config.get("block_size")) else T
    n = params - block * D
    return {"flops_per_token": 6 * n + 12 * L * D * T, "non_embedding_params": n,
            "formula": "6N + 12·L·D·T (nanoGPT estimate_mfu; N excludes the position table)"}


def _steps_for_stats(steps: list[dict[str, Any]], warmup: int) -> tuple[list[dict], str]:
    after = [r for r in steps if r["step"] > warmup]
    clean = [r for r in after if not r.get("profiling")]
    if clean:
        return clean, f"steps after warmup ({warmup}), profiler-window steps left out"
    if after:
        return after, f"steps after warmup ({warmup}); all of them were profiled"
    return steps, "all steps (none after warmup were recorded)"


def _results(config: dict, steps: list[dict], started: dict) -> dict:
    warmup = config.get("warmup_steps", 0)
    stats_rows, over = _steps_for_stats(steps, warmup)
    losses = [x for x in (finite_num(r.get("loss")) for r in steps) if x is not None]
    tps = [x for x in (finite_num(r.get("tokens_per_s")) for r in stats_rows) if x is not None]
    ms = [x for x in (finite_num(r.get("step_ms")) for r in stats_rows) if x is not None]
    after_reset = [r for r in steps if r["step"] >= max(warmup, 1)] or steps

    def peak(rows: list[dict], key: str) -> int | None:
        vals = [finite_num(r.get(key)) for r in rows]
        vals = [v for v in vals if v is not None]
        return int(max(vals)) if vals else None

    last = steps[-1] if steps else {}
    amp = str(started.get("amp") or config.get("resolved_amp") or config.get("amp") or "off")
    params = started.get("params") if is_int(started.get("params")) else None
    flops = _flops_per_token(config, params)
    tps50 = percentile(tps, 50)
    device_name = started.get("device_name")
    peak_fs, why = peak_flops(device_name, amp)
    achieved = flops["flops_per_token"] * tps50 if flops and tps50 else None
    mfu = achieved / peak_fs if achieved and peak_fs else None
    return {
        "steps_recorded": len(steps),
        "last_step": last.get("step"),
        "stats_over": over, "stats_steps": len(stats_rows),
        "final_loss": finite_num(last.get("loss")),
        "mean_loss": sum(losses) / len(losses) if losses else None,
        "mean_loss_over": "all recorded steps with a finite loss",
        "tokens_per_s_p50": tps50,
        "step_ms_p50": percentile(ms, 50), "step_ms_p95": percentile(ms, 95),
        "peak_allocated_bytes": peak(after_reset, "peak_allocated_bytes"),
        "peak_reserved_bytes": peak(after_reset, "reserved_bytes"),
        "driver_peak_bytes": peak(steps, "driver_used_bytes"),
        "host_rss_peak_bytes": peak(steps, "host_rss_bytes"),
        "peaks_note": ("Peak allocated since the reset after warmup (CPU: max of sampled "
                       "heap readings); reserved and driver: max of step-end samples"),
        "skipped_steps": last.get("skipped_steps") if is_int(last.get("skipped_steps")) else 0,
        "wall_s": finite_num(last.get("time_s")),
        "tokens_trained": len(steps) * config["batch_size"] * config["seq_len"],
        "flops_per_token": flops["flops_per_token"] if flops else None,
        "flops_formula": flops["formula"] if flops else None,
        "achieved_flops_per_s": achieved,
        "device_peak_flops_per_s": peak_fs,
        "mfu": mfu,
        "mfu_note": why,
    }


def build_report(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Everything report.md shows, as plain JSON-able data. ReportError if not a run folder.

    Any other exception means input this reader did not foresee: it becomes a ReportError too,
    so `memtop report` says so in one line (exit 2) instead of failing as a crash.
    """
    try:
        return _build_report(Path(run_dir))
    except ReportError:
        raise
    except Exception as exc:
        raise ReportError(f"{run_dir}: unexpected content in the run's files "
                          f"({type(exc).__name__}: {exc})") from None


def _build_report(run_dir: Path) -> dict[str, Any]:
    if not run_dir.exists():
        raise ReportError(f"{run_dir} does not exist")
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir} is not a folder")
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise ReportError(f"{run_dir} has no metrics.jsonl: not a memtop run folder")
    config = read_config(run_dir)
    rows = read_rows(metrics)
    steps, events = rows["steps"], rows["events"]
    if not steps and not events:
        what = f"{rows['bad']} unreadable lines" if rows["bad"] else "no rows"
        raise ReportError(f"{metrics} holds {what}: nothing to report")
    steps.sort(key=lambda r: r["step"])
    started = next((e for e in events if e["event"] == "run_started"), {})
    finished = next((e for e in reversed(events) if e.get("event") == "run_finished"), None)
    ledgers = [e for e in events if e.get("event") == "ledger" and isinstance(e.get("lines"), list)]
    ledger = ledgers[-1] if ledgers else None
    reasons = []
    if finished is None:
        reasons.append("no run_finished row: the run was killed, crashed hard, or is still going")
    if rows["truncated"]:
        reasons.append("the last line of metrics.jsonl is cut short (killed while writing)")
    bad_inside = rows["bad"] - (1 if rows["truncated"] and rows["bad"] else 0)
    if bad_inside > 0:
        reasons.append(f"{bad_inside} unreadable line(s) in metrics.jsonl were skipped")
    system = started.get("system") if isinstance(started.get("system"), dict) else None
    if system is None:
        system = dict(host_info(), source="report time (the run did not record it)")
    amp = str(started.get("amp") or config.get("resolved_amp") or config.get("amp") or "off")
    model_info = (ledger or {}).get("model") or {}
    report: dict[str, Any] = {
        "report_version": REPORT_VERSION,
        "run_dir": str(run_dir),
        "generated_at": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "complete": not reasons, "incomplete_reasons": reasons,
        "status": {"reason": finished.get("reason") if finished else None,
                   "errors": [{"step": e.get("step"), "type": e.get("error_type"),
                               "message": e.get("message")}
                              for e in events if e.get("event") == "error"]},
        "hardware": {
            "device": started.get("device") or config.get("resolved_device"),
            "device_name": started.get("device_name"),
            "device_memory_bytes": started.get("device_total_bytes"),
            "gpu_name": system.get("gpu_name"), "gpu_capability": system.get("gpu_capability"),
            "cpu_model": system.get("cpu_model"), "cpu_count": system.get("cpu_count"),
            "ram_bytes": system.get("ram_bytes"),
        },
        "software": {k: system.get(k) for k in ("python", "torch", "cuda", "cudnn", "numpy",
                                               "memtop", "os", "source")},
        "model": {"layers": config["layers"], "dim": config["dim"], "heads": config["heads"],
                  "vocab": model_info.get("vocab_size") or 256,
                  "block_size": config.get("block_size"), "attention": config.get("attention"),
                  "params": started.get("params")},
        "input": {"batch_size": config["batch_size"], "seq_len": config["seq_len"],
                  "tokens_per_step": config["batch_size"] * config["seq_len"],
                  "token_dtype": "int64", "param_dtype": model_info.get("param_dtype") or "float32",
                  "compute_dtype": {"bf16": "bfloat16 (autocast)",
                                    "fp16": "float16 (autocast + GradScaler)"}.get(amp,
                                                                                   "float32")},
        "mode": "train",
        "amp": amp,
        "warmup_steps": config.get("warmup_steps", 0),
        "measurement": {
            "steps": len(steps), "steps_planned": config.get("steps"),
            "sync_rule": SYNC_RULE,
            "timing": "wall clock per step, batch fetch to optimizer update (time.perf_counter)",
            "counters": started.get("counters"), "driver_counter": started.get("driver_counter"),
            "seed": config.get("seed"),
        },
        "results": _results(config, steps, started),
        "profiles": _profiles(events),
        "leaks": [_strip(e) for e in events if e.get("event") in LEAK_EVENTS],
        "ledger": _strip(ledger) if ledger else None,
        "ledger_events": len(ledgers),
        "rows": {"steps": len(steps), "events": len(events), "unreadable": rows["bad"]},
    }
    if isinstance(config.get("baseline"), str) and config["baseline"]:
        from probes.baseline import report_section

        report["baseline"] = report_section(config["baseline"], run_dir)
    report["finding"] = finding(report)
    return report


def _strip(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k not in ("time_s", "traceback")}


def _profiles(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Profiler windows taken: done ones with their top 5 ops, cancelled ones with the reason."""
    windows = []
    for e in events:
        name = e.get("event")
        if name == "profile_done":
            ops = e.get("top_ops") if isinstance(e.get("top_ops"), list) else []
            windows.append({"step": e.get("step"), "status": "done", "dir": e.get("dir"),
                            "sort_by": e.get("sort_by"), "analysis_s": e.get("analysis_s"),
                            "top_ops": [op for op in ops if isinstance(op, dict)][:5]})
        elif name == "profile_cancelled":
            windows.append({"step": e.get("step"), "status": "cancelled", "dir": e.get("dir"),
                            "reason": e.get("reason"), "top_ops": []})
    return windows


def _write_text(path: Path, text: str) -> None:
    """Temp file with a unique name + rename: a reader never sees half a report.md."""
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_report(run_dir: str | os.PathLike[str]) -> Path:
    """Write report.json and report.md (atomically) into the run folder; returns report.md.

    Serialised by a lock, so writers on several threads replace the files one after the other.
    """
    run_dir = Path(run_dir)
    with _WRITE_LOCK:
        report = build_report(run_dir)
        try:
            text = render_markdown(report)
        except Exception as exc:  # a rendering gap for data build_report let through
            raise ReportError(f"{run_dir}: cannot render the report "
                              f"({type(exc).__name__}: {exc})") from None
        md = run_dir / "report.md"
        try:
            write_json(run_dir / "report.json", report)
            _write_text(md, text)
        except OSError as exc:
            raise ReportError(f"cannot write the report into {run_dir}: "
                              f"{exc.strerror or exc}") from None
        except (ValueError, RecursionError) as exc:  # e.g. a deeply nested recorded value
            raise ReportError(f"{run_dir}: cannot serialise the report "
                              f"({type(exc).__name__}: {exc})") from None
    return md
