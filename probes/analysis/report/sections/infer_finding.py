"""An inference run's finding: status, the phases side by side, the cache against its formula
and without it, and a falsifiable next hypothesis (tutorial exercise 7). A summary section:
built after the others, from what they built; report.md shows it as the training finding."""

from __future__ import annotations

from typing import Any

from probes import records as R
from probes.analysis.report.context import ReportContext
from probes.analysis.report.sections.profiles import op_time
from probes.tools.kvcache import KV_FORMULA
from probes.tools.units import format_rate


def infer_finding(r: dict[str, Any]) -> str:
    res = r["results"]
    reason = r["status"]["reason"]
    out = ["The run finished." if reason == "finished" else f"The run ended: {reason}."]
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
            op = max(w["top_ops"], key=lambda o: op_time(o)[0])  # ops only: no labels
            names = {o.get("name") for o in w["top_ops"]}
            label = next((r for r in w.get("ranges") or [] if r.get("name") == R.DECODE), None)
            out.append(f"In the decode window the hottest op was {op.get('name')}.")
            if label is not None and op_time(label)[0] > op_time(op)[0]:
                out.append("The decode label's own time (the Python and dispatch between its "
                           "ops) was above it: decode is launch-bound here.")
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


def build(ctx: ReportContext) -> dict[str, Any]:
    return {"finding": infer_finding(ctx.built)}
