"""An inference run's results (`memtop infer`): time to first token and per-token decode time
kept apart, the KV cache measured against its formula and along the context, the cache-off
baseline, and how many sequences the memory admits."""

from __future__ import annotations

from typing import Any

from probes import records as R
from probes.analysis.report.context import ReportContext
from probes.analysis.report.sections.results import peak_rows
from probes.records import counts_toward_peak, finite_num, is_disturbed
from probes.records.names import counter_name
from probes.tools.kvcache import KV_FORMULA
from probes.tools.stats import percentile
from probes.tools.tables import markdown_table
from probes.tools.units import format_bytes, format_estimate, format_ms, format_pct, format_rate


def _slope(xs: list[float], ys: list[float]) -> tuple[float | None, float | None]:
    """Least-squares slope and the largest residual relative to the range of ys."""
    n = len(xs)
    if n < 3:
        return None, None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None, None
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    span = (max(ys) - min(ys)) or 1.0
    worst = max(abs(y - (my + b * (x - mx))) for x, y in zip(xs, ys, strict=True)) / span
    return b, worst


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(context length, the key's value) of the rows that hold an int for the key."""
    kept = [r for r in rows if isinstance(r.get(key), int)]
    return [float(r.get("context_tokens") or 0) for r in kept], [float(r[key]) for r in kept]


def infer_results(ctx: ReportContext) -> dict[str, Any]:
    """Every figure the inference report shows, from the step rows and events."""
    config, steps, started = ctx.config, ctx.steps, ctx.started
    requests = ctx.metrics.named(R.REQUEST_DONE)
    warm = 1 if len({r.get("request") for r in steps}) > 1 else 0  # request 1 warms up

    def rows(phase: str) -> list[dict[str, Any]]:
        return [r for r in steps if r.get("phase") == phase and (r.get("request") or 0) > warm]

    pre, dec = rows(R.PREFILL), rows(R.DECODE)
    pre_clean = [r for r in pre if not is_disturbed(r)] or pre  # records/disturbed.py
    dec_clean = [r for r in dec if not is_disturbed(r)] or dec
    peak_of = [r for r in steps if counts_toward_peak(r)] or steps

    def ms(rs: list[dict[str, Any]]) -> list[float]:
        return [v for v in (finite_num(r.get("step_ms")) for r in rs) if v is not None]

    def rate(rs: list[dict[str, Any]]) -> float | None:
        secs = sum(ms(rs)) / 1000.0
        toks = sum(r.get("tokens") or 0 for r in rs)
        return toks / secs if secs > 0 and toks else None

    def peak(key: str, rows: list[dict[str, Any]] = peak_of) -> int | None:
        vals = [finite_num(r.get(key)) for r in rows]
        vals = [v for v in vals if v is not None]
        return int(max(vals)) if vals else None

    def last(name: str) -> dict[str, Any] | None:
        found = ctx.metrics.named(name)
        return found[-1] if found else None

    kv_rows = [r for r in steps if isinstance(r.get("kv_cache_bytes"), int)
               and isinstance(r.get("kv_cache_predicted_bytes"), int)
               and r["kv_cache_predicted_bytes"] > 0]
    errors = [r["kv_cache_bytes"] / r["kv_cache_predicted_bytes"] - 1 for r in kv_rows]
    # linearity, like with like: the longest measured (not warm-up, unprofiled) decode run
    by_req: dict[Any, list[dict[str, Any]]] = {}
    for r in steps:
        if r.get("phase") == R.DECODE and not is_disturbed(r):
            by_req.setdefault(r.get("request"), []).append(r)
    measured = {k: v for k, v in by_req.items() if (k or 0) > warm} or by_req
    slope_req = max(measured, key=lambda k: len(measured[k])) if measured else None
    longest = measured.get(slope_req, [])
    kv_slope, kv_worst = _slope(*_series(longest, "kv_cache_bytes"))
    al_slope, _ = _slope(*_series(longest, "allocated_bytes"))
    warm_slope = _slope(*_series(by_req.get(1, []), "allocated_bytes"))[0] if warm else None
    per_token = started.get("kv_bytes_per_token")
    batch = config.get("batch_size")
    per_position = per_token * batch if isinstance(per_token, int) and isinstance(batch, int) \
        else None
    return {
        "requests": requests, "warmup_requests": warm,
        "ttft_ms_cold": finite_num(requests[0].get("ttft_ms")) if requests else None,
        "ttft_ms_p50": percentile(ms(pre_clean), 50),
        "ttft_ms_p95": percentile(ms(pre_clean), 95),
        "decode_ms_p50": percentile(ms(dec_clean), 50),
        "decode_ms_p95": percentile(ms(dec_clean), 95),
        "prefill_tokens_per_s": rate(pre_clean), "decode_tokens_per_s": rate(dec_clean),
        "prefill_steps": len(pre_clean), "decode_steps": len(dec_clean),
        # every later step of a phase was disturbed: its figures are of disturbed steps
        "prefill_all_disturbed": bool(pre) and not any(not is_disturbed(r) for r in pre),
        "decode_all_disturbed": bool(dec) and not any(not is_disturbed(r) for r in dec),
        "peak_allocated_bytes": peak("peak_allocated_bytes"),
        "peak_reserved_bytes": peak("reserved_bytes"),
        "driver_peak_bytes": peak("driver_used_bytes"),
        "kv_cache_bytes_max": peak("kv_cache_bytes", steps),
        "kv_cache_predicted_bytes_max": peak("kv_cache_predicted_bytes", steps),
        "kv_error_max": max(errors, key=abs) if errors else None,
        "kv_rows_checked": len(errors),
        "kv_bytes_per_token": per_token, "kv_bytes_per_position": per_position,
        "kv_slope_bytes_per_position": kv_slope, "kv_linearity_worst": kv_worst,
        "allocated_slope_bytes_per_position": al_slope, "slope_request": slope_req,
        "warmup_allocated_slope_bytes_per_position": warm_slope,
        "device": started.get("device"), "amp": ctx.amp, "attention": config.get("attention"),
        "baseline": last(R.CACHE_BASELINE),
        "admission": last(R.ADMISSION),
        "switches": started.get("switches"), "weights": started.get("weights"),
    }


def build(ctx: ReportContext) -> dict[str, Any]:
    return {"results": infer_results(ctx)}


def _kv_cache(res: dict[str, Any]) -> list[str]:
    heap = counter_name("allocated", str(res.get("device") or "cpu"))
    req = res.get("slope_request")
    run = f"request {req}'s decode steps" if req is not None else "the decode steps"
    return ["## KV cache", "",
            f"Measured: the bytes of the cache tensors' storages after every step. Predicted: "
            f"{KV_FORMULA}. Largest difference over {res['kv_rows_checked']} steps: "
            f"{format_pct(res['kv_error_max'])}. Across {run} (the longest measured decode run) "
            f"the cache grew {format_bytes(res['kv_slope_bytes_per_position'])} per position "
            f"(predicted {format_bytes(res['kv_bytes_per_position'])} for B sequences; worst "
            f"residual from a straight line {format_pct(res['kv_linearity_worst'])} of the "
            f"range), and {heap} grew "
            f"{format_bytes(res['allocated_slope_bytes_per_position'])} per position over the "
            "same steps." + _warmup_growth(res, heap), ""]


def _warmup_growth(res: dict[str, Any], heap: str) -> str:
    """Why request 1 grew more than the cache, when it did: measured, said in one sentence."""
    warm, steady = res.get("warmup_allocated_slope_bytes_per_position"), \
        res.get("allocated_slope_bytes_per_position")
    per_pos = res.get("kv_bytes_per_position") or res.get("kv_slope_bytes_per_position")
    # said only for a clear excess: twice the measured request's rate and more than the cache
    if warm is None or steady is None or not per_pos or warm < 2 * steady \
            or warm - steady <= per_pos:
        return ""
    onednn = (res.get("device"), res.get("amp"), res.get("attention")) == \
        ("cpu", "bf16", "explicit")
    why = (" (on CPU under bf16, oneDNN keeps a kernel for each matmul shape it meets, and each "
           "new length is a new shape for explicit attention's two batched matmuls, ~0.55 MiB "
           "each as measured in docs/INFERENCE.md)" if onednn else "")
    return (f" In request 1 (the warm-up) {heap} grew {format_bytes(warm)} per position, "
            f"{format_bytes(warm - steady)} more than in request {res.get('slope_request')}: "
            f"memory kept once for each new context length, which later requests reuse{why}.")


def _cache_baseline(base: dict[str, Any] | None) -> list[str]:
    md = ["## Cache-off baseline", ""]
    if not base:
        return md + ["Not measured (--baseline-tokens 0, or the run stopped first).", ""]
    return md + [markdown_table(["", "with cache", "recompute (no cache)"], [
        ["per token p50", format_ms(base.get("cached_ms_per_token_p50"), 2),
         format_ms(base.get("recompute_ms_per_token_p50"), 2)],
        ["total", format_ms(base.get("cached_total_ms")),
         format_ms(base.get("recompute_total_ms"))],
        ["peak", format_bytes(base.get("cached_peak_bytes")),
         format_bytes(base.get("recompute_peak_bytes"))],
        ["KV cache held", format_bytes(base.get("kv_cache_bytes")), "0 B"]],
        right={1, 2}), "",
        f"{base.get('tokens')} tokens from request 1's prompts, greedy; same tokens both "
        f"ways: {'yes' if base.get('same_tokens') else 'NO'}. Peaks: "
        f"{base.get('peak_note')}.", ""]


def _admission(adm: dict[str, Any] | None) -> list[str]:
    md = ["## Admission", ""]
    if not adm:
        return md + ["Not measured.", ""]
    return md + [f"At a budget of {format_bytes(adm.get('budget_bytes'))} "
                 f"({adm.get('budget_source')}), with {format_bytes(adm.get('used_bytes'))} held "
                 f"before the first request (weights {format_bytes(adm.get('weights_bytes'))}): "
                 f"**{format_estimate(adm.get('sequences_fit'))} concurrent sequences** of "
                 f"{adm.get('seq_len')} "
                 f"tokens fit, each needing {format_bytes(adm.get('kv_bytes_per_sequence'))} of "
                 f"cache and {format_bytes(adm.get('temp_bytes_per_sequence'))} of prefill "
                 f"temporaries (measured in request 1). Limited by {adm.get('limit')}.", ""]


def _all_disturbed(flag: Any) -> str:
    return (" (every one after the warm-up ran in a profiler or memory window: these are "
            "its disturbed steps)") if flag else ""


def render(section: dict[str, Any], report: dict[str, Any]) -> list[str]:
    res = section["results"]
    rows = [
        ["TTFT p50 / p95 (prefill)" + _all_disturbed(res.get("prefill_all_disturbed")),
         f"{format_ms(res['ttft_ms_p50'])} / {format_ms(res['ttft_ms_p95'])}"],
        ["TTFT of request 1 (cold)", format_ms(res["ttft_ms_cold"])],
        ["decode per token p50 / p95" + _all_disturbed(res.get("decode_all_disturbed")),
         f"{format_ms(res['decode_ms_p50'], 2)} / {format_ms(res['decode_ms_p95'], 2)}"],
        ["prefill tokens/s", format_rate(res["prefill_tokens_per_s"])],
        ["decode tokens/s", format_rate(res["decode_tokens_per_s"])],
        *peak_rows(res),
        ["KV cache at the end (measured)", format_bytes(res["kv_cache_bytes_max"])],
        ["KV cache predicted", format_bytes(res["kv_cache_predicted_bytes_max"])],
        ["KV bytes per token (one sequence)", format_bytes(res["kv_bytes_per_token"])],
    ]
    return (["## Results", "", markdown_table(["metric", "value"], rows, right={1}), ""]
            + _kv_cache(res) + _cache_baseline(res["baseline"]) + _admission(res["admission"]))
