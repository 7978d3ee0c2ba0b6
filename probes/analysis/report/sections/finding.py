"""The finding: a paragraph generated from the other sections (status, speed, the largest
ledger line, the hottest op, leaks) ending in a next hypothesis to test (docs/ARCHITECTURE.md,
the method). A summary section: built after the others, from what they built."""

from __future__ import annotations

from typing import Any

from probes import records as R
from probes.analysis.report.context import ReportContext
from probes.analysis.report.sections.profiles import op_time, window_label
from probes.records import incomplete
from probes.tools.units import format_bytes, format_duration, format_ms, format_pct, format_rate

_NON_TENSOR = ("runtime heap at start", "other / temporaries", *R.CACHE_LINE.values())


def _ledger_sentences(led: dict[str, Any]) -> tuple[list[str], str | None]:
    lines = [ln for ln in led.get("lines", []) if isinstance(ln, dict)]
    exact = [ln for ln in lines
             if ln.get("name") not in _NON_TENSOR and isinstance(ln.get("measured_bytes"), int)]
    if not exact:
        return [], None
    top = max(exact, key=lambda ln: ln["measured_bytes"])
    total = sum(ln["measured_bytes"] for ln in exact)
    if total <= 0:
        return [], None
    out = [f"The largest ledger line (step {led.get('sampled_step')}) is {top.get('name')}: "
           f"{format_bytes(top['measured_bytes'])}, {top['measured_bytes'] / total:.0%} of the "
           f"{format_bytes(total)} held by the tensors measured."]
    acts = next((ln for ln in exact if ln.get("name") == "saved activations"), None)
    if acts and isinstance(acts.get("predicted_bytes"), int) and acts["predicted_bytes"] > 0:
        off = acts["measured_bytes"] / acts["predicted_bytes"] - 1
        out.append(f"Saved activations measured {format_bytes(acts['measured_bytes'])} against "
                   f"{format_bytes(acts['predicted_bytes'])} from {acts.get('formula')} "
                   f"({off:+.0%}).")
    alloc, explained = led.get("allocated_bytes"), led.get("explained_bytes")
    if isinstance(alloc, int) and alloc > 0 and isinstance(explained, int):
        out.append(f"The ledger explains {explained / alloc:.0%} of the "
                   f"{format_bytes(alloc)} "
                   f"{R.counter_name('allocated', str(led.get('device') or 'cpu'))} at the end "
                   f"of forward ({led.get('counter') or 'allocator'}).")
    peak = led.get("peak_allocated_bytes")
    if str(led.get("device", "")).startswith("cuda") and isinstance(peak, int) and peak > 0:
        out.append(f"On the GPU the exact lines sum to {format_bytes(total)} against a peak "
                   f"allocated of {format_bytes(peak)} ({total / peak - 1:+.0%}): gradients and "
                   "saved activations never fully coexist, so their sum bounds the peak from "
                   "above, while workspaces and logits add to it.")
    hypothesis = None
    scores = led.get("attention_scores_bytes") or 0
    if top.get("name") == "saved activations":
        if scores and scores >= 0.1 * top["measured_bytes"]:
            hypothesis = (f"the explicit T×T attention scores hold {format_bytes(scores)}; "
                          "--attention sdpa should remove them (and their T² growth) from the "
                          "peak")
        else:
            hypothesis = ("activations scale with B×T: halving the batch size should take about "
                          "half of them off the peak (activation checkpointing trades compute "
                          "for the rest)")
    elif top.get("name") == "optimizer state":
        hypothesis = ("AdamW state is 2×P×4 B whatever the AMP mode; only a smaller or sharded "
                      "optimizer state shrinks it, not lower-precision activations")
    elif top.get("name") in ("parameters", "gradients"):
        hypothesis = ("weights and gradients dominate: a larger batch costs little extra memory "
                      "and should raise tokens/s")
    return out, hypothesis


def _leak_sentences(leaks: list[dict[str, Any]], after_s: float | None = None) -> list[str]:
    suspected = [e for e in leaks if e.get("event") == "leak_suspected"]
    out = []
    if suspected and incomplete(R.LEAK_SUSPECTED, suspected[0]):
        out.append(f"A leak was suspected at step {suspected[0].get('step')}, but its row is an "
                   f"{incomplete(R.LEAK_SUSPECTED, suspected[0])}.")
    elif suspected:
        e = suspected[0]
        counter = R.LEAK_COUNTER_NAMES.get(str(e.get("counter")), e.get("counter"))
        s = (f"A leak was suspected at step {e.get('step')}: {counter} grew "
             f"{format_bytes(e.get('bytes_per_step'))}/step since step {e.get('since_step')}")
        fill = R.fill_text(e)
        if fill:
            s += f"; at the alert {fill}"
        s += f" ({e['hint']})." if e.get("hint") else "."
        cleared = [c for c in leaks if c.get("event") == "leak_cleared"]
        if cleared:
            s += f" It cleared at step {cleared[-1].get('step')}."
        out.append(s)
    elif any(e.get("event") == "leak_demo_started" for e in leaks):
        out.append("The leak demo ran, but no leak_suspected event was recorded.")
    else:
        out.append("No leak was suspected.")
    guard = [e for e in leaks if e.get("event") == "memory_guard"]
    if guard:
        g = guard[-1]
        s = f"The memory guard stopped the run at step {g.get('step')}"
        if isinstance(after_s, (int, float)):
            s += f", {format_duration(after_s)} after the leak alert"
        out.append(s + ".")
    return out


def finding(r: dict[str, Any]) -> str:
    """The paragraph, from the report's other sections."""
    res = r["results"]
    out: list[str] = []
    reason = r["status"]["reason"]
    if not r["complete"]:
        out.append(f"This run is incomplete ({r['incomplete_reasons'][0]}); the figures come "
                   f"from the {res['steps_recorded']} step rows that exist.")
    elif reason == "failed" and r["status"]["errors"]:
        err = r["status"]["errors"][-1]
        out.append(f"The run failed at step {err.get('step')}: {err.get('type')}: "
                   f"{err.get('message')}.")
    else:
        steps = res["steps_recorded"]
        out.append(f"The run finished after {steps} steps." if reason == "finished" else
                   f"The run ended after {steps} steps: {reason}.")
    rate = next(((res[k], unit) for k, unit in (("tokens_per_s_p50", "tokens/s"),
                                               ("samples_per_s_p50", "samples/s"))
                 if res.get(k) is not None), None)
    if rate is not None:
        s = (f"It trained at {format_rate(rate[0])} {rate[1]} (p50) with step "
             f"times of {format_ms(res['step_ms_p50'])} p50 and "
             f"{format_ms(res['step_ms_p95'])} p95")
        s += (f", an MFU of {format_pct(res['mfu'])} ({res['mfu_note']})." if res["mfu"] is not None
              else ".")  # why there is no MFU is said once, under Results
        out.append(s)
    hypothesis = None
    if r.get("ledger"):
        sentences, hypothesis = _ledger_sentences(r["ledger"])
        out.extend(sentences)
    else:
        out.append("No ledger was measured (the run ended before the first step after warmup).")
    windows = [w for w in r["profiles"] if w["top_ops"]]
    if windows:
        w = windows[-1]
        op = max(w["top_ops"], key=lambda o: op_time(o)[0])
        t, kind = op_time(op)
        out.append(f"In the profiler window over {window_label(w)} the hottest op was "
                   f"{op.get('name')} ({t / 1000:.1f} ms {kind} over {op.get('calls')} calls).")
    out.extend(_leak_sentences(r["leaks"], (r.get("leak_timing") or {}).get("guard_after_alert_s")))
    if res["skipped_steps"]:
        out.append(f"{res['skipped_steps']} optimizer steps were skipped (inf/nan gradients).")
    if hypothesis:
        out.append(f"Next hypothesis: {hypothesis}.")
    return " ".join(out)


def build(ctx: ReportContext) -> dict[str, Any]:
    return {"finding": finding(ctx.built)}


def render(section: dict[str, Any], report: dict[str, Any]) -> list[str]:
    return ["## Finding", "", section["finding"], ""]
