"""A training run's results: loss, speed over the measured steps, memory peaks, the CUDA
allocator's state at the end, and MFU where the FLOPs per token and the device's peak are known.
"""

from __future__ import annotations

from typing import Any

from probes import records as R
from probes.analysis.measured import LOSS_WINDOW, measured_steps, peak_steps
from probes.analysis.report.context import ReportContext, is_gpt_config, run_amp, warmup_steps
from probes.analysis.report.flops import flops_per_token, peak_flops
from probes.counters.cuda_stats import driver_overhead_bytes, fragmentation
from probes.records import finite_num, is_int
from probes.tools.stats import percentile
from probes.tools.tables import markdown_table
from probes.tools.units import format_bytes, format_ms, format_pct, format_rate

PEAKS_NOTE = ("Peak allocated: max of the per-step high-water marks since warmup "
              "(CPU: max of sampled heap readings); reserved and driver: max of "
              f"step-end samples; {R.PEAK_RULE}")


def _tokens_per_step(config: dict[str, Any], started: dict[str, Any]) -> int | None:
    if is_gpt_config(config):
        return config["batch_size"] * config["seq_len"]
    value = started.get("tokens_per_step")
    return value if is_int(value) and value > 0 else None


def _peak(rows: list[dict], key: str) -> int | None:
    vals = [finite_num(r.get(key)) for r in rows]
    vals = [v for v in vals if v is not None]
    return int(max(vals)) if vals else None


def workers_peaks(steps: list[dict]) -> dict[str, Any]:
    """The DataLoader workers' peaks over every step that saw some (the box fills whatever the
    step: warmup and disturbed steps count here): how many at most, their PSS and USS, and the
    trainer's RSS plus their USS at the same step (what the guard counts, probes/counters/
    fill.py). None where no step saw a worker (or a folder from before memtop read them)."""
    rows = [r for r in steps if is_int(r.get("workers")) and r["workers"] > 0]
    tree = [r["host_rss_bytes"] + r["workers_uss_bytes"] for r in rows
            if is_int(r.get("host_rss_bytes")) and is_int(r.get("workers_uss_bytes"))]
    return {"workers_peak": max((r["workers"] for r in rows), default=None),
            "workers_pss_peak_bytes": _peak(rows, "workers_pss_bytes"),
            "workers_uss_peak_bytes": _peak(rows, "workers_uss_bytes"),
            "tree_peak_bytes": max(tree, default=None)}


def peaks_note(finished: dict[str, Any] | None, device: str = "cpu") -> str:
    """How the peaks were taken, in the device's counter names; on CPU how often the
    end-of-forward heap read (the activations' peak) was taken: where it was skipped for its
    cost the sampled peak can miss that height."""
    if str(device).startswith("cuda"):
        return PEAKS_NOTE
    note = ("Peak heap used: max of the sampled heap readings since warmup (end of step, end of "
            "forward while that read is cheap, the ledger's snapshots); heap held and RSS: max "
            f"of step-end samples; {R.PEAK_RULE}")
    finished = finished or {}
    taken = finished.get("mid_step_heap_reads")
    skipped = finished.get("mid_step_heap_reads_skipped")
    if not (is_int(taken) and is_int(skipped)) or not skipped:
        return note
    return (f"{note}. The end-of-forward heap read was taken at {taken:,} of "
            f"{taken + skipped:,} forward passes (skipped where it cost over 0.2% of a step or "
            "the end-of-step read was spread for its cost), so "
            "the heap peak is a lower bound")


def train_results(config: dict[str, Any], steps: list[dict], started: dict,
                  finished: dict[str, Any] | None = None) -> dict[str, Any]:
    """The figures of one metrics file's steps (the run's, or one rank's under Ranks)."""
    warmup = warmup_steps(config)
    stats_rows, over = measured_steps(steps, warmup)
    losses = [x for x in (finite_num(r.get("loss")) for r in steps) if x is not None]
    tps = [x for x in (finite_num(r.get("tokens_per_s")) for r in stats_rows) if x is not None]
    sps = [x for x in (finite_num(r.get("samples_per_s")) for r in stats_rows) if x is not None]
    ms = [x for x in (finite_num(r.get("step_ms")) for r in stats_rows) if x is not None]
    peak_rows = peak_steps(steps, warmup)
    last = steps[-1] if steps else {}
    amp = run_amp(config, started, steps)
    params = started.get("params") if is_int(started.get("params")) else None
    flops = flops_per_token(config, params, started.get("flops_per_token"))
    tps50 = percentile(tps, 50)
    peak_fs, why = peak_flops(started.get("device_name"), amp, started.get("mig") is True)
    if flops is None:
        why = ("FLOPs per token of this model are unknown to memtop (give Monitor "
               "flops_per_token= to get MFU)")
    achieved = flops["flops_per_token"] * tps50 if flops and tps50 else None
    mfu = achieved / peak_fs if achieved and peak_fs else None
    tokens_per_step = _tokens_per_step(config, started)
    device = str(last.get("device") or started.get("device") or "")
    return {
        "steps_recorded": len(steps),
        "last_step": last.get("step"),
        "stats_over": over, "stats_steps": len(stats_rows),
        "final_loss": finite_num(last.get("loss")),
        "recent_loss": sum(losses[-LOSS_WINDOW:]) / len(losses[-LOSS_WINDOW:]) if losses
        else None,  # where the run ended up; a mean over the whole run mixes in its start
        "recent_loss_over": f"the last {min(len(losses), LOSS_WINDOW)} steps with a finite loss",
        "tokens_per_s_p50": tps50,
        "samples_per_s_p50": percentile(sps, 50),
        "step_ms_p50": percentile(ms, 50), "step_ms_p95": percentile(ms, 95),
        "peak_allocated_bytes": _peak(peak_rows, "peak_allocated_bytes"),
        "peak_reserved_bytes": _peak(peak_rows, "reserved_bytes"),
        "driver_peak_bytes": _peak(peak_rows, "driver_used_bytes"),
        "host_rss_peak_bytes": _peak(peak_rows, "host_rss_bytes"),
        "peaks_note": peaks_note(finished, device),
        **workers_peaks(steps),
        "device": device,
        **_allocator(last, str(started.get("device") or "")),
        "skipped_steps": last.get("skipped_steps") if is_int(last.get("skipped_steps")) else 0,
        "wall_s": finite_num(last.get("time_s")),
        "tokens_trained": tokens_per_step * len(steps) if tokens_per_step else None,
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


def build(ctx: ReportContext) -> dict[str, Any]:
    return {"results": train_results(ctx.config, ctx.steps, ctx.started, ctx.finished)}


def peak_rows(res: dict[str, Any]) -> list[list[Any]]:
    """The three peaks under the names the panes give them on the run's device (CPU: heap
    used, heap held, RSS; probes/records/names.py)."""
    device = str(res.get("device") or "")
    return [[R.peak_name(pane, device), format_bytes(res[key])] for pane, key in (
        ("allocated", "peak_allocated_bytes"), ("reserved", "peak_reserved_bytes"),
        ("driver", "driver_peak_bytes"))]


def workers_rows(res: dict[str, Any]) -> list[list[Any]]:
    """The workers' peaks, where the run had workers (none for a folder without them)."""
    if not res.get("workers_peak"):
        return []
    return [[f"peak DataLoader workers' PSS (up to {res['workers_peak']})",
             format_bytes(res.get("workers_pss_peak_bytes"))],
            ["peak workers' USS (their own pages)",
             format_bytes(res.get("workers_uss_peak_bytes"))],
            ["peak RSS + workers' USS (the trainer and its workers)",
             format_bytes(res.get("tree_peak_bytes"))]]


def render(section: dict[str, Any], report: dict[str, Any]) -> list[str]:
    res = section["results"]
    rows = [
        ["final loss", f"{res['final_loss']:.4f}" if res["final_loss"] is not None else None],
        [f"loss, mean of the last {min(LOSS_WINDOW, res['steps_recorded'])} steps",
         f"{res['recent_loss']:.4f}" if res["recent_loss"] is not None else None],
        ["tokens/s p50", format_rate(res["tokens_per_s_p50"])],
        *([["samples/s p50", format_rate(res["samples_per_s_p50"])]]
          if res.get("samples_per_s_p50") is not None else []),
        ["step time p50", format_ms(res["step_ms_p50"])],
        ["step time p95", format_ms(res["step_ms_p95"])],
        *peak_rows(res),
        *workers_rows(res),
        ["skipped steps", res["skipped_steps"]],
        ["FLOPs/token", f"{res['flops_per_token']:,}" if res["flops_per_token"] else None],
        ["achieved FLOP/s", format_rate(res["achieved_flops_per_s"], " FLOP/s")],
        ["MFU", format_pct(res["mfu"])],
    ]
    if res.get("cache_free_bytes") is not None or res.get("alloc_retries") is not None:
        rows += [  # CUDA only (probes/counters/cudamem.py)
            ["cache free (reserved − allocated)", format_bytes(res.get("cache_free_bytes"))],
            ["cudaMalloc retries / OOMs", f"{res.get('alloc_retries')} / {res.get('ooms')}"],
            ["NVML − reserved (context, workspaces)",
             format_bytes(res.get("driver_minus_reserved_bytes"))],
        ]
    return ["## Results", "", markdown_table(["metric", "value"], rows, right={1}), "",
            (f"Timing statistics over {res['stats_steps']} {res['stats_over']}. "
             if res["stats_steps"] else "No step was recorded to time. ") +
            f"{res['peaks_note']}."
            + (" DataLoader workers: the sampler's readings (about once a second) over every "
               "step, PSS from /proc/PID/smaps_rollup (a shared page split among the processes "
               "that map it)." if res.get("workers_peak") else "")
            + f" FLOPs/token: {res['flops_formula'] or 'unknown'}. "
            f"MFU: {res['mfu_note']}." + (f" Allocator: {res['allocator_hint']}"
                                          if res.get("allocator_hint") else ""), ""]
