"""The experiment report (docs/ARCHITECTURE.md, the method): report.json + report.md, built
from a run folder's files.

Only files are read (config.json, metrics.jsonl), never torch, so it runs from any thread and on
a machine other than the one that trained. A killed run still gets a report from the rows that
exist, marked incomplete; a folder that is not a run raises ReportError and nothing is written.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any

from probes.analysis.measured import measured_steps
from probes.analysis.report.ranks import ranks_section
from probes.analysis.report.read import (
    LEAK_EVENTS,
    ReportError,
    finite_num,
    is_gpt_config,
    is_int,
    read_config,
    read_rows,
)
from probes.analysis.report.text import finding, render_markdown
from probes.counters.cuda_stats import driver_overhead_bytes, fragmentation
from probes.counters.host import host_info
from probes.runfolder import metrics_files, write_json
from probes.tools.stats import percentile

REPORT_VERSION = 1
SYNC_RULE = ("one blocking device-to-host transfer per step, after the optimizer step: loss, "
             "gradient norm and GradScaler scale stacked and read together "
             "(probes/monitor/stepvalues.py);"
             " memtop's trainer uses fused AdamW on CUDA, so GradScaler.step passes found-inf to "
             "the kernel instead of reading it (a non-fused optimizer adds that .item()); the "
             "allocator counters and NVML are host reads; no explicit synchronize")
# Dense peak FLOP/s from vendor datasheets (no sparsity): (model pattern, {compute dtype: FLOP/s}).
# fp32 means plain FP32 (torch leaves TF32 matmuls off by default). A pattern must match the whole
# model token at the start of the name once the vendor words are removed ("A100-SXM4-80GB" ->
# A100; "RTX A1000" is not an A100). H800/A800 are the export variants: same compute.
_END = r"(?=$|[\s-])"
PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    (rf"H[18]00{_END}.*PCIe", {"bf16": 756e12, "fp16": 756e12, "fp32": 51e12}),
    # H100 NVL and H200 NVL share the lower-clocked figures; before the SXM catch-all.
    (rf"H[12]00{_END}.*NVL", {"bf16": 835e12, "fp16": 835e12, "fp32": 60e12}),
    (rf"(H100|H200|H800|GH200){_END}", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
    (rf"A[18]00{_END}", {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}),
    (rf"L40S{_END}", {"bf16": 362e12, "fp16": 362e12, "fp32": 91.6e12}),
    (rf"L4{_END}", {"bf16": 121e12, "fp16": 121e12, "fp32": 30.3e12}),
    (rf"A10{_END}", {"bf16": 125e12, "fp16": 125e12, "fp32": 31.2e12}),
    (r"RTX 4090$", {"bf16": 165e12, "fp16": 165e12, "fp32": 82.6e12}),
    (rf"V100{_END}", {"fp16": 125e12, "fp32": 15.7e12}),
    (rf"T4{_END}", {"fp16": 65e12, "fp32": 8.1e12}),
)
_VENDOR_WORDS = re.compile(r"^(NVIDIA\s+)?(Tesla\s+|GeForce\s+)?", re.IGNORECASE)


# One writer at a time: `r` twice, `r` then `q`, or the quit thread and shutdown() after a forced
# quit would otherwise build and replace report.json/report.md from two threads at once.
_WRITE_LOCK = threading.Lock()


# building -----------------------------------------------------------------------------------------
def peak_flops(device_name: str | None, amp: str,
               mig: bool | None = None) -> tuple[float | None, str]:
    """(peak FLOP/s, why) for the device and compute dtype; None where memtop has no figure.

    A MIG slice (``mig``, or "MIG" in the name) has only part of the GPU's SMs; memtop keeps no
    per-profile figures, so MFU is not computed rather than divided by the whole GPU's peak."""
    if not device_name or device_name.upper() == "CPU":
        return None, ("CPU peak FLOP/s depends on cores, clocks and vector units; memtop keeps "
                      "no table for CPUs, so MFU is not computed (achieved FLOP/s is)")
    if mig or re.search(r"\bMIG\b", device_name):
        return None, (f"{device_name} is a MIG slice with a fraction of the GPU's SMs; memtop "
                      "keeps no per-slice peak, so MFU is not computed (achieved FLOP/s is)")
    dtype = amp if amp in ("bf16", "fp16") else "fp32"
    model = _VENDOR_WORDS.sub("", device_name.strip())
    for pattern, table in PEAK_FLOPS:
        if re.match(pattern, model, re.IGNORECASE):
            if dtype in table:
                return table[dtype], f"{device_name}: {table[dtype] / 1e12:g} TFLOP/s {dtype} dense"
            return None, f"{device_name} has no {dtype} tensor-core figure in memtop's table"
    return None, f"peak FLOP/s of {device_name!r} is not in memtop's table"


def _flops_per_token(config: dict[str, Any], params: int | None,
                     given: Any = None) -> dict[str, Any] | None:
    """The loop's own figure (Monitor's flops_per_token) or, for memtop's GPT, nanoGPT's
    estimate 6N + 12·L·D·T, N without the position table (block_size × D). Any other model:
    unknown, never guessed."""
    if finite_num(given) and given > 0:
        return {"flops_per_token": given, "non_embedding_params": None,
                "formula": "given by the training loop (Monitor flops_per_token=)"}
    if not params or not is_gpt_config(config):
        return None
    L, D, T = config["layers"], config["dim"], config["seq_len"]
    block = config.get("block_size") if is_int(config.get("block_size")) else T
    n = params - block * D
    return {"flops_per_token": 6 * n + 12 * L * D * T, "non_embedding_params": n,
            "formula": "6N + 12·L·D·T (nanoGPT estimate_mfu; N excludes the position table)"}


def _run_amp(config: dict[str, Any], started: dict[str, Any], steps: list[dict]) -> str:
    """The precision the steps ran in: a Monitor with amp="auto" learns it in the first forward
    pass, so its step rows know it and run_started does not."""
    amp = started.get("amp") or config.get("resolved_amp") or config.get("amp") or "off"
    if amp == "auto":
        amp = next((r["amp"] for r in reversed(steps) if isinstance(r.get("amp"), str)), "off")
    return str(amp)


def _warmup(config: dict[str, Any]) -> int:
    mon = config.get("monitor") if isinstance(config.get("monitor"), dict) else {}
    value = config.get("warmup_steps", mon.get("warmup_steps", 0))
    return value if is_int(value) and value >= 0 else 0


def _tokens_per_step(config: dict[str, Any], started: dict[str, Any]) -> int | None:
    if is_gpt_config(config):
        return config["batch_size"] * config["seq_len"]
    value = started.get("tokens_per_step")
    return value if is_int(value) and value > 0 else None


def _model_and_input(config: dict[str, Any], started: dict[str, Any],
                     model_info: dict[str, Any], amp: str) -> tuple[dict, dict]:
    """What the model and its input were: memtop's GPT by its shape, any other model by name."""
    compute = {"bf16": "bfloat16 (autocast)",
               "fp16": "float16 (autocast + GradScaler)"}.get(amp, "float32")
    param_dtype = model_info.get("param_dtype") or "float32"
    if is_gpt_config(config):
        model = {"kind": "GPT", "layers": config["layers"], "dim": config["dim"],
                 "heads": config["heads"], "vocab": model_info.get("vocab_size") or 256,
                 "block_size": config.get("block_size"), "attention": config.get("attention"),
                 "params": started.get("params")}
        inp = {"batch_size": config["batch_size"], "seq_len": config["seq_len"],
               "tokens_per_step": config["batch_size"] * config["seq_len"],
               "token_dtype": "int64", "param_dtype": param_dtype, "compute_dtype": compute}
        return model, inp
    mon = config.get("monitor") if isinstance(config.get("monitor"), dict) else {}
    model = {"kind": str(mon.get("model") or "a model of the training loop's own"),
             "params": started.get("params")}
    inp = {"tokens_per_step": started.get("tokens_per_step"),
           "samples_per_step": started.get("samples_per_step"),
           "param_dtype": param_dtype, "compute_dtype": compute}
    return model, inp


def _results(config: dict, steps: list[dict], started: dict) -> dict:
    warmup = _warmup(config)
    stats_rows, over = measured_steps(steps, warmup)
    losses = [x for x in (finite_num(r.get("loss")) for r in steps) if x is not None]
    tps = [x for x in (finite_num(r.get("tokens_per_s")) for r in stats_rows) if x is not None]
    sps = [x for x in (finite_num(r.get("samples_per_s")) for r in stats_rows) if x is not None]
    ms = [x for x in (finite_num(r.get("step_ms")) for r in stats_rows) if x is not None]
    after_reset = [r for r in steps if r["step"] >= max(warmup, 1)] or steps

    def peak(rows: list[dict], key: str) -> int | None:
        vals = [finite_num(r.get(key)) for r in rows]
        vals = [v for v in vals if v is not None]
        return int(max(vals)) if vals else None

    last = steps[-1] if steps else {}
    amp = _run_amp(config, started, steps)
    params = started.get("params") if is_int(started.get("params")) else None
    flops = _flops_per_token(config, params, started.get("flops_per_token"))
    tps50 = percentile(tps, 50)
    device_name = started.get("device_name")
    peak_fs, why = peak_flops(device_name, amp, started.get("mig") is True)
    if flops is None:
        why = ("FLOPs per token of this model are unknown to memtop (give Monitor "
               "flops_per_token= to get MFU)")
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
        "samples_per_s_p50": percentile(sps, 50),
        "step_ms_p50": percentile(ms, 50), "step_ms_p95": percentile(ms, 95),
        "peak_allocated_bytes": peak(after_reset, "peak_allocated_bytes"),
        "peak_reserved_bytes": peak(after_reset, "reserved_bytes"),
        "driver_peak_bytes": peak(steps, "driver_used_bytes"),
        "host_rss_peak_bytes": peak(steps, "host_rss_bytes"),
        "peaks_note": ("Peak allocated: max of the per-step high-water marks since warmup "
                       "(CPU: max of sampled heap readings); reserved and driver: max of "
                       "step-end samples"),
        **_allocator(last, str(started.get("device") or "")),
        "skipped_steps": last.get("skipped_steps") if is_int(last.get("skipped_steps")) else 0,
        "wall_s": finite_num(last.get("time_s")),
        "tokens_trained": _tokens_per_step(config, started) * len(steps)
        if _tokens_per_step(config, started) else None,
        "flops_per_token": flops["flops_per_token"] if flops else None,
        "flops_formula": flops["formula"] if flops else None,
        "achieved_flops_per_s": achieved,
        "device_peak_flops_per_s": peak_fs,
        "mfu": mfu,
        "mfu_note": why,
    }


def _allocator(last: dict[str, Any], device: str) -> dict[str, Any]:
    """CUDA: the cache's free bytes, cudaMalloc retries, OOMs and NVML − reserved at the last
    step (probes/counters/cudamem.py); None on CPU, where these figures do not exist."""
    if not str(last.get("device") or device).startswith("cuda"):
        return {"cache_free_bytes": None, "alloc_retries": None, "ooms": None,
                "driver_minus_reserved_bytes": None}
    ints = {k: last.get(k) if is_int(last.get(k)) else None for k in (
        "allocated_bytes", "reserved_bytes", "driver_used_bytes", "alloc_retries", "ooms")}
    frag = fragmentation(ints["allocated_bytes"], ints["reserved_bytes"],
                         alloc_retries=ints["alloc_retries"], ooms=ints["ooms"])
    return {"cache_free_bytes": frag.cached_free_bytes if frag else None,
            "alloc_retries": ints["alloc_retries"], "ooms": ints["ooms"],
            "allocator_hint": frag.hint if frag else None,
            "driver_minus_reserved_bytes": driver_overhead_bytes(ints["driver_used_bytes"],
                                                                 ints["reserved_bytes"]),
            "driver_minus_reserved_note": "CUDA context, library workspaces (cuBLAS, cuDNN, "
                                          "NCCL) and memory allocated outside PyTorch"}


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
    files = metrics_files(run_dir)
    if not files:
        raise ReportError(f"{run_dir} has no metrics.jsonl: not a memtop run folder")
    metrics = next(iter(files.values()))  # metrics.jsonl, or rank 0's file under several ranks
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
        reasons.append(f"no run_finished row in {metrics.name}: the run was killed, crashed "
                       "hard, or is still going")
    if rows["truncated"]:
        reasons.append(f"the last line of {metrics.name} is cut short (killed while writing)")
    bad_inside = rows["bad"] - (1 if rows["truncated"] and rows["bad"] else 0)
    if bad_inside > 0:
        reasons.append(f"{bad_inside} unreadable line(s) in {metrics.name} were skipped")
    ranks = ranks_section(run_dir, files, config, _results) if len(files) > 1 else None
    if ranks is not None:
        missing = [r["rank"] for r in ranks["per_rank"] if r["end"] is None and r["rank"]]
        if missing:
            reasons.append("no run_finished row for rank " + ", ".join(map(str, missing)))
    system = started.get("system") if isinstance(started.get("system"), dict) else None
    if system is None:
        system = dict(host_info(), source="report time (the run did not record it)")
    amp = _run_amp(config, started, steps)
    model_info = (ledger or {}).get("model") or {}
    if config.get("mode") == "infer":
        return _infer_report(run_dir, config, steps, events, rows, reasons, finished, system,
                             started, amp)
    model, inp = _model_and_input(config, started, model_info, amp)
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
        "model": model,
        "input": inp,
        "mode": "train",
        "amp": amp,
        "warmup_steps": _warmup(config),
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
        "metrics_file": metrics.name,
        "ranks": ranks,
    }
    if isinstance(config.get("baseline"), str) and config["baseline"]:
        from probes.analysis.baseline import report_section

        report["baseline"] = report_section(config["baseline"], run_dir)
    report["finding"] = finding(report)
    return report


def _infer_report(run_dir: Path, config: dict[str, Any], steps: list[dict], events: list[dict],
                  rows: dict[str, Any], reasons: list[str], finished: dict | None,
                  system: dict[str, Any], started: dict[str, Any], amp: str) -> dict[str, Any]:
    """`memtop infer`'s report (probes/analysis/report/infer.py): same header, inference
    sections."""
    from probes.analysis.report.infer import infer_finding, infer_results

    report: dict[str, Any] = {
        "report_version": REPORT_VERSION, "run_dir": str(run_dir), "mode": "infer",
        "generated_at": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "complete": not reasons, "incomplete_reasons": reasons,
        "status": {"reason": finished.get("reason") if finished else None,
                   "errors": [{"step": e.get("step"), "type": e.get("error_type"),
                               "message": e.get("message")}
                              for e in events if e.get("event") == "error"]},
        "hardware": {"device": started.get("device"), "device_name": started.get("device_name"),
                     "gpu_name": system.get("gpu_name"), "cpu_model": system.get("cpu_model"),
                     "device_memory_bytes": started.get("device_total_bytes")},
        "software": {k: system.get(k) for k in ("python", "torch", "cuda", "cudnn", "numpy",
                                               "memtop", "os", "source")},
        "model": {"layers": config["layers"], "dim": config["dim"], "heads": config["heads"],
                  "block_size": config.get("block_size"), "attention": config.get("attention"),
                  "params": started.get("params")},
        "input": {"batch_size": config["batch_size"], "prompt_len": config["prompt_len"],
                  "new_tokens": config["new_tokens"], "requests": config["requests"],
                  "sampling": (f"top-k {config.get('top_k')}" if config.get("top_k")
                               else "greedy")},
        "amp": amp,
        "results": infer_results(config, steps, events),
        "profiles": _profiles(events),
        "rows": {"steps": len(steps), "events": len(events), "unreadable": rows["bad"]},
    }
    report["finding"] = infer_finding(report)
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
                            "phase": e.get("phase"),
                            "sort_by": e.get("sort_by"), "analysis_s": e.get("analysis_s"),
                            "top_ops": [op for op in ops if isinstance(op, dict)][:5]})
        elif name == "profile_cancelled":
            windows.append({"step": e.get("step"), "status": "cancelled", "dir": e.get("dir"),
                            "phase": e.get("phase"),
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
            if report.get("mode") == "infer":
                from probes.analysis.report.infer import render_infer_markdown

                text = render_infer_markdown(report)
            else:
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
