"""Text of the inference panes (pure functions, tested without an app): the KV cache against its
prediction, prefill vs decode throughput, and the admission line. Units come from tui/format.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from probes.records import StepSample
from probes.tools.stats import percentile
from probes.tools.units import NA, format_bytes, format_estimate, format_ms
from tui.format import fit, format_value


def kv_lines(s: StepSample | None, block_size: int | None, width: int) -> tuple[str, str]:
    """("KV cache 1.5 MiB  pred 1.5 MiB +0.0%", "ctx 97/128  B8  step 65 decode")."""
    if s is None or s.kv_cache_bytes is None:
        return fit("KV cache  waiting for the first prefill…", width), ""
    pred = s.kv_cache_predicted_bytes
    off = f" {s.kv_cache_bytes / pred - 1:+.1%}" if pred else ""
    top = f"KV cache {format_bytes(s.kv_cache_bytes)}  predicted {format_bytes(pred)}{off}"
    if len(top) > width:
        top = f"KV {format_bytes(s.kv_cache_bytes)} pred {format_bytes(pred)}{off}"
    ctx = f"ctx {s.context_tokens}" + (f"/{block_size}" if block_size else "")
    sub = f"{ctx}  request {s.request}  {s.phase}"
    return fit(top, width), fit(sub, width)


def phase_lines(prefill: Sequence[StepSample], decode: Sequence[StepSample], width: int) \
        -> tuple[str, str]:
    """Prefill and decode side by side in words: tokens/s of each, TTFT, per-token p50/p95."""
    def rate(rows: Sequence[StepSample]) -> str:
        secs = sum(r.step_ms for r in rows) / 1000.0
        toks = sum(r.tokens or 0 for r in rows)
        return format_value("rate", toks / secs) if secs > 0 and toks else NA

    ttft = [r.step_ms for r in prefill]
    dec = [r.step_ms for r in decode]
    pre = f"prefill {rate(prefill)} tok/s  TTFT p50 {format_ms(percentile(ttft, 50))}"
    dcd = (f"decode  {rate(decode)} tok/s  p50 {format_ms(percentile(dec, 50))} "
           f"p95 {format_ms(percentile(dec, 95))}/token")
    if len(dcd) > width:
        dcd = (f"decode  {rate(decode)} tok/s  p50/p95 {format_ms(percentile(dec, 50))}/"
               f"{format_ms(percentile(dec, 95))}").replace(" ms/", "/")
    return fit(pre, width), fit(dcd, width)


def admission_text(d: Mapping[str, Any] | None, width: int) -> str:
    if not d:
        return fit("admission: measured after request 1's prefill…", width)
    fit_n = format_estimate(d.get("sequences_fit"))
    text = (f"admission: {fit_n} sequences of {d.get('seq_len')} tokens fit in "
            f"{format_bytes(d.get('budget_bytes'))} ({d.get('budget_source')}); limited by "
            f"{d.get('limit')}")
    if len(text) > width:  # 80 columns: the count, the budget and the limit, shorter
        head = (f"admits {fit_n} × {d.get('seq_len')}-token seqs in "
                f"{format_bytes(d.get('budget_bytes'))}; limit: {d.get('limit_kind')}")
        text = (f"{head} ({format_bytes(d.get('kv_bytes_per_sequence'))} KV + "
                f"{format_bytes(d.get('temp_bytes_per_sequence'))} temp/seq)")
        if len(text) > width:
            text = head
    return fit(text, width)
