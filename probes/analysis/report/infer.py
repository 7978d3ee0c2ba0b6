"""The report of an inference run (`memtop infer`): the tutorial's §6.3 fields with mode
prefill / decode kept apart (pitfall 9), the KV cache against its formula, the cache-off baseline,
the admission line, and one top-ops table per phase. Files only, like
probes/analysis/report/build.py.
"""

from __future__ import annotations

from typing import Any

from probes import records as R
from probes.analysis.report.text import _op_time
from probes.records import EVENT_KINDS, clean, finite_num, switches_text
from probes.tools.kvcache import KV_FORMULA
from probes.tools.stats import percentile
from probes.tools.tables import markdown_table
from probes.tools.units import format_bytes, format_ms, format_pct, format_rate, format_us


def _event(events: list[dict[str, Any]], name: str, last: bool = True) -> dict[str, Any] | None:
    found = [clean(e, EVENT_KINDS[name].fields) for e in events if e.get("event") == name]
    return (found[-1] if last else found[0]) if found else None


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


def infer_results(config: dict[str, Any], steps: list[dict[str, Any]],
                  events: list[dict[str, Any]]) -> dict[str, Any]:
    """Every figure the inference report shows, from the step rows and events."""
    requests = [clean(e, EVENT_KINDS[R.REQUEST_DONE].fields) for e in events
                if e.get("event") == R.REQUEST_DONE]
    warm = 1 if len({r.get("request") for r in steps}) > 1 else 0  # request 1 warms up

    def rows(phase: str) -> list[dict[str, Any]]:
        return [r for r in steps if r.get("phase") == phase and (r.get("request") or 0) > warm]

    pre, dec = rows(R.PREFILL), rows(R.DECODE)
    pre_clean = [r for r in pre if not r.get("profiling")] or pre
    dec_clean = [r for r in dec if not r.get("profiling")] or dec

    def ms(rs: list[dict[str, Any]]) -> list[float]:
        return [v for v in (finite_num(r.get("step_ms")) for r in rs) if v is not None]

    def rate(rs: list[dict[str, Any]]) -> float | None:
        secs = sum(ms(rs)) / 1000.0
        toks = sum(r.get("tokens") or 0 for r in rs)
        return toks / secs if secs > 0 and toks else None

    def peak(key: str) -> int | None:
        vals = [finite_num(r.get(key)) for r in steps]
        vals = [v for v in vals if v is not None]
        return int(max(vals)) if vals else None

    kv_rows = [r for r in steps if isinstance(r.get("kv_cache_bytes"), int)
               and isinstance(r.get("kv_cache_predicted_bytes"), int)
               and r["kv_cache_predicted_bytes"] > 0]
    errors = [r["kv_cache_bytes"] / r["kv_cache_predicted_bytes"] - 1 for r in kv_rows]
    started = _event(events, R.RUN_STARTED, last=False) or {}
    # linearity: the request with the most unprofiled decode rows
    by_req: dict[Any, list[dict[str, Any]]] = {}
    for r in steps:
        if r.get("phase") == R.DECODE and not r.get("profiling"):
            by_req.setdefault(r.get("request"), []).append(r)
    longest = max(by_req.values(), key=len) if by_req else []
    xs = [float(r.get("context_tokens") or 0) for r in longest]
    kv_slope, kv_worst = _slope(xs, [float(r.get("kv_cache_bytes") or 0) for r in longest])
    alloc = [r for r in longest if isinstance(r.get("allocated_bytes"), int)]
    al_slope, _ = _slope([float(r.get("context_tokens") or 0) for r in alloc],
                         [float(r["allocated_bytes"]) for r in alloc])
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
        "peak_allocated_bytes": peak("peak_allocated_bytes"),
        "peak_reserved_bytes": peak("reserved_bytes"),
        "driver_peak_bytes": peak("driver_used_bytes"),
        "kv_cache_bytes_max": peak("kv_cache_bytes"),
        "kv_cache_predicted_bytes_max": peak("kv_cache_predicted_bytes"),
        "kv_error_max": max(errors, key=abs) if errors else None,
        "kv_rows_checked": len(errors),
        "kv_bytes_per_token": per_token, "kv_bytes_per_position": per_position,
        "kv_slope_bytes_per_position": kv_slope, "kv_linearity_worst": kv_worst,
        "allocated_slope_bytes_per_position": al_slope,
        "baseline": _event(events, R.CACHE_BASELINE),
        "admission": _event(events, R.ADMISSION),
        "switches": started.get("switches"), "weights": started.get("weights"),
    }


def infer_finding(r: dict[str, Any]) -> str:
    """Status, the phases side by side, the cache check, and a falsifiable next hypothesis
    (tutorial exercise 7)."""
    res = r["results"]
    out = [f"The run ended ({r['status']['reason']})."]
    pre, dec = res["prefill_tokens_per_s"], res["decode_tokens_per_s"]
    if pre and dec:
        out.append(f"Prefill read {format_rate(pre)} tokens/s and decode made "
                   f"{format_rate(dec)} tokens/s: {pre / dec:.0f}x apart, so one averaged "
                   "line would describe neither phase.")
    if res["kv_error_max"] is not None:
        out.append(f"The KV cache measured within {abs(res['kv_error_max']):.1%} of "
                   f"{KV_FORMULA} over {res['kv_rows_checked']} steps.")
    base = res["baseline"]
    if base and base.get("speedup"):
        out.append(f"Without the cache each token cost {base['speedup']:.1f}x more "
                   f"({base.get('recompute_ms_per_token_p50', 0):.1f} vs "
                   f"{base.get('cached_ms_per_token_p50', 0):.1f} ms at "
                   f"{base.get('tokens')} tokens)"
                   + ("" if base.get("same_tokens") else "; the tokens DIFFERED") + ".")
    hypothesis = None
    for w in r["profiles"]:
        if w.get("phase") == R.DECODE and w["top_ops"]:
            op = max(w["top_ops"], key=lambda o: _op_time(o)[0])
            names = {o.get("name") for o in w["top_ops"]}
            if op.get("name") == R.DECODE:
                out.append("In the decode window the largest entry was the decode label's own "
                           "time (Python and dispatch between ops), above every aten op: decode "
                           "is launch-bound here.")
            else:
                out.append(f"In the decode window the hottest op was {op.get('name')}.")
            if "aten::cat" in names:
                hypothesis = ("aten::cat (the grown cache's copy per token) is among decode's "
                              "top ops: a cache preallocated to the longest context should "
                              "remove it and lower decode p50")
    if hypothesis is None and res["decode_ms_p50"]:
        hypothesis = ("decode is launch-bound at this size: doubling --batch-size should "
                      "nearly double decode tokens/s at almost the same per-token latency, "
                      "until reading the cache dominates")
    if hypothesis:
        out.append(f"Next hypothesis: {hypothesis}.")
    return " ".join(out)


def render_infer_markdown(r: dict[str, Any]) -> str:
    res, hw, sw, model, inp = r["results"], r["hardware"], r["software"], r["model"], r["input"]
    name = r["run_dir"].rstrip("/").split("/")[-1]
    md = [f"# memtop inference report: {name}", ""]
    if not r["complete"]:
        md += ["> **Incomplete run.** " + " ".join(r["incomplete_reasons"]), ""]
    md += ["## Finding", "", r["finding"], "", "## Setup", ""]
    setup = [
        ["hardware", f"{hw['device']} {hw.get('gpu_name') or hw.get('cpu_model')}"],
        ["software", f"Python {sw['python']}, torch {sw['torch']}, CUDA {sw['cuda'] or 'none'}"
                     f", memtop {sw['memtop']}"],
        ["model", f"GPT: {model['layers']} layers, dim {model['dim']}, {model['heads']} heads, "
                  f"block {model['block_size']}, {model['attention']} attention, "
                  f"{model['params']} params; weights {res['weights']}"],
        ["input", f"B={inp['batch_size']}, prompt {inp['prompt_len']}, {inp['new_tokens']} new "
                  f"tokens, {inp['requests']} requests; sampling {inp['sampling']}"],
        ["mode", "prefill / decode, reported apart"],
        ["switches", switches_text(res["switches"])],
        ["amp", r["amp"]],
        ["warmup", f"request 1 of {inp['requests']} left out of the statistics"
                   if res["warmup_requests"] else "none (a single request)"],
        ["measurement", "wall clock per step until its new tokens are on the host "
                        "(one .cpu() per step); profiled steps left out"],
    ]
    md += [markdown_table(["field", "value"], setup), "", "## Results", ""]
    base = res["baseline"] or {}
    rows = [
        ["TTFT p50 / p95 (prefill)",
         f"{format_ms(res['ttft_ms_p50'])} / {format_ms(res['ttft_ms_p95'])}"],
        ["TTFT of request 1 (cold)", format_ms(res["ttft_ms_cold"])],
        ["decode per token p50 / p95", f"{format_ms(res['decode_ms_p50'], 2)} / "
                                       f"{format_ms(res['decode_ms_p95'], 2)}"],
        ["prefill tokens/s", format_rate(res["prefill_tokens_per_s"])],
        ["decode tokens/s", format_rate(res["decode_tokens_per_s"])],
        ["peak allocated", format_bytes(res["peak_allocated_bytes"])],
        ["peak reserved", format_bytes(res["peak_reserved_bytes"])],
        ["driver-level peak", format_bytes(res["driver_peak_bytes"])],
        ["KV cache at the end (measured)", format_bytes(res["kv_cache_bytes_max"])],
        ["KV cache predicted", format_bytes(res["kv_cache_predicted_bytes_max"])],
        ["KV bytes per token (one sequence)", format_bytes(res["kv_bytes_per_token"])],
    ]
    md += [markdown_table(["metric", "value"], rows, right={1}), ""]
    md += ["## KV cache", "",
           f"Measured: the bytes of the cache tensors' storages after every step. Predicted: "
           f"{KV_FORMULA}. Largest difference over {res['kv_rows_checked']} steps: "
           f"{format_pct(res['kv_error_max'])}. Across the longest decode run the cache grew "
           f"{format_bytes(res['kv_slope_bytes_per_position'])} per position (predicted "
           f"{format_bytes(res['kv_bytes_per_position'])} for B sequences; worst residual from "
           f"a straight line {format_pct(res['kv_linearity_worst'])} of the range); the "
           f"allocator's counter grew "
           f"{format_bytes(res['allocated_slope_bytes_per_position'])} per position over the "
           "same steps.", ""]
    md += ["## Cache-off baseline", ""]
    if base:
        md += [markdown_table(["", "with cache", "recompute (no cache)"], [
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
    else:
        md += ["Not measured (--baseline-tokens 0, or the run stopped first).", ""]
    md += ["## Admission", ""]
    adm = res["admission"]
    if adm:
        md += [f"At a budget of {format_bytes(adm.get('budget_bytes'))} "
               f"({adm.get('budget_source')}), with {format_bytes(adm.get('used_bytes'))} held "
               f"before the first request (weights {format_bytes(adm.get('weights_bytes'))}): "
               f"**{adm.get('sequences_fit')} concurrent sequences** of {adm.get('seq_len')} "
               f"tokens fit, each needing {format_bytes(adm.get('kv_bytes_per_sequence'))} of "
               f"cache and {format_bytes(adm.get('temp_bytes_per_sequence'))} of prefill "
               f"temporaries (measured in request 1). Limited by {adm.get('limit')}.", ""]
    else:
        md += ["Not measured.", ""]
    md += ["## Profiler windows, one per phase", ""]
    if not r["profiles"]:
        md += ["No profiler window was taken.", ""]
    for w in r["profiles"]:
        phase = w.get("phase") or "?"
        if w["status"] != "done":
            md += [f"### {phase}: window {w['status']} ({w.get('reason')})", ""]
            continue
        md += [f"### {phase} (sorted by {w['sort_by']} time; trace in `{w['dir']}`)", ""]
        ops = [[op.get("name"), op.get("calls"), format_us(op.get("self_cpu_us")),
                format_us(op.get("cpu_total_us")), format_us(op.get("self_device_us"))]
               for op in w["top_ops"]]
        md += [markdown_table(["op", "calls", "self CPU", "CPU total", "self device"], ops,
                     right={1, 2, 3, 4}), ""]
    if r["status"]["errors"]:
        md += ["## Errors", ""] + [f"- step {e['step']}: {e['type']}: {e['message']}"
                                   for e in r["status"]["errors"]] + [""]
    return "\n".join(md)
