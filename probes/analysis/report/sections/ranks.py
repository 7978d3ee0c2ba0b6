"""The report's section for a run of several ranks: each rank's results, the spread across
ranks (min / median / max), the slowest rank (the one the others wait for: the rank table's
definition), the highest peak, and the effective global batch. Built from the per-rank files
only; a lone process has no such section (null).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from probes.analysis.measured import measured_steps
from probes.analysis.ranks import (
    failure_text,
    rank_ends,
    read_process_exits,
    slowest_rank,
    slowest_text,
    spread,
)
from probes.analysis.report.context import ReportContext, warmup_steps
from probes.analysis.report.sections.results import train_results
from probes.analysis.step_split import phase_medians
from probes.records.names import counter_name
from probes.tools.tables import markdown_table
from probes.tools.units import format_bytes, format_ms, format_rate

SPREAD_KEYS = ("tokens_per_s_p50", "step_ms_p50", "step_ms_p95", "peak_allocated_bytes",
               "peak_reserved_bytes", "driver_peak_bytes")


def peak_titles(device_type: str) -> dict[str, str]:
    """The per-rank peaks by their counter's one name: heap peak, peak heap held, peak RSS on
    CPU; peak, peak reserved, peak NVML used on CUDA."""
    return {"peak_allocated_bytes": counter_name("peak", device_type),
            "peak_reserved_bytes": f"peak {counter_name('reserved', device_type)}",
            "driver_peak_bytes": f"peak {counter_name('driver', device_type)}"}


def build(ctx: ReportContext) -> dict[str, Any]:
    """Per-rank results (counted as the run's own), spread and highlights."""
    return {"ranks": _ranks(ctx) if ctx.ranks else None}


def _ranks(ctx: ReportContext) -> dict[str, Any]:
    config = ctx.config
    per_rank: list[dict[str, Any]] = []
    for rank, metrics in ctx.ranks.items():
        res = train_results(config, metrics.steps, metrics.started)
        per_rank.append({"rank": rank or 0, "device": metrics.started.get("device"),
                         "end": metrics.end,
                         **{k: res.get(k) for k in ("steps_recorded", "last_step",
                                                    "final_loss", *SPREAD_KEYS)}})
    section: dict[str, Any] = {"count": len(per_rank), "per_rank": per_rank}
    measured = {rank or 0: measured_steps(m.steps, warmup_steps(config))[0]
                for rank, m in ctx.ranks.items()}
    section["phase_medians_ms"] = {str(k): phase_medians(v) for k, v in measured.items()}
    section["spread"] = {k: _spread([r[k] for r in per_rank]) for k in SPREAD_KEYS}
    slowest = slowest_rank(measured)  # the rank table's definition: the rank others wait for
    section["slowest"] = slowest.to_json() if slowest else None
    section["slowest_text"] = slowest_text(slowest) if len(measured) > 1 else None
    peaks = [(r["peak_allocated_bytes"], r["rank"]) for r in per_rank
             if r["peak_allocated_bytes"] is not None]
    if peaks:
        top, top_rank = max(peaks)
        median = section["spread"]["peak_allocated_bytes"]["median"]
        section["highest_peak"] = {"rank": top_rank, "peak_allocated_bytes": top,
                                   "over_median_bytes": top - median if median else None}
    batch, seq = config.get("batch_size"), config.get("seq_len")
    if isinstance(batch, int) and isinstance(seq, int):
        n = len(per_rank)
        tps = [r["tokens_per_s_p50"] for r in per_rank if r["tokens_per_s_p50"] is not None]
        section["global_batch"] = {"ranks": n, "sequences": n * batch,
                                   "tokens": n * batch * seq,
                                   "tokens_per_s": sum(tps) if len(tps) == n else None,
                                   "note": "each rank's B×T per optimizer step, summed over "
                                           "ranks (DDP averages their gradients)"}
    section["failure"] = failure_text(rank_ends(ctx.run_dir),
                                     read_process_exits(ctx.run_dir))
    return section


def _spread(values: list[Any]) -> dict[str, float | None]:
    s = spread([v for v in values if isinstance(v, (int, float))])
    return dict(zip(("min", "median", "max"), s, strict=True)) if s else \
        {"min": None, "median": None, "max": None}


def render(section: dict[str, Any], report: dict[str, Any]) -> list[str]:
    sec = section["ranks"]
    if sec is None:
        return []
    md = ["## Ranks", ""]
    rows = [[r["rank"], r["steps_recorded"], format_rate(r["tokens_per_s_p50"]),
             format_ms(r["step_ms_p50"]), format_ms(r["step_ms_p95"]),
             format_bytes(r["peak_allocated_bytes"]), format_bytes(r["peak_reserved_bytes"]),
             format_bytes(r["driver_peak_bytes"]), r["end"] or "no run_finished"]
            for r in sec["per_rank"]]
    device = str(next((r["device"] for r in sec["per_rank"] if r.get("device")), "cpu"))
    titles = peak_titles(device)  # the counters' one names (probes/records/names.py)
    md += [markdown_table(["rank", "steps", "tokens/s p50", "step p50", "step p95",
                           *titles.values(), "end"], rows, right={0, 1, 2, 3, 4, 5, 6, 7}), ""]
    sp = sec["spread"]
    fmt: dict[str, Callable[[Any], str]] = {"tokens_per_s_p50": format_rate,
                                            "step_ms_p50": format_ms, "step_ms_p95": format_ms}
    names = {"tokens_per_s_p50": "tokens/s p50", "step_ms_p50": "step time p50",
             "step_ms_p95": "step time p95", **titles}
    srows = [[names[k], *(fmt.get(k, format_bytes)(sp[k][x]) for x in ("min", "median", "max"))]
             for k in SPREAD_KEYS]
    md += ["Spread across ranks:", "", markdown_table(["metric", "min", "median", "max"], srows,
                                             right={1, 2, 3}), ""]
    if sec.get("slowest_text"):  # the words of the rank table (probes/analysis/ranks.py)
        text, how = sec["slowest_text"], ""
        if (sec.get("slowest") or {}).get("phase"):
            how = (" (phase medians against the other ranks'; under DDP the others wait for it "
                   "in backward, the gradient all-reduce)")
        md.append(f"- {text[0].upper()}{text[1:]}{how}.")
    if sec.get("highest_peak"):
        h = sec["highest_peak"]
        md.append(f"- Highest peak: rank {h['rank']} ({format_bytes(h['peak_allocated_bytes'])},"
                  f" {format_bytes(h['over_median_bytes'])} over the median).")
    if sec.get("global_batch"):
        g = sec["global_batch"]
        md.append(f"- Effective global batch: {g['ranks']} ranks × B = {g['sequences']} "
                  f"sequences, {g['tokens']} tokens per optimizer step; together "
                  f"{format_rate(g['tokens_per_s'])} tokens/s ({g['note']}).")
    if sec.get("failure"):
        md.append(f"- Failure: {sec['failure']}.")
    return md + [""]
