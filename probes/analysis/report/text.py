"""Words for the report: the generated "finding" paragraph and report.md.

report.md uses pipe tables padded to column width, so the raw file reads as well in a terminal
(``cat``, ``less``) as it renders on GitHub. Long notes go under a table, not in it.
"""

from __future__ import annotations

from typing import Any

from probes.tools.tables import markdown_table
from probes.tools.units import (
    format_bytes,
    format_duration,
    format_ms,
    format_pct,
    format_rate,
    format_us,
)

_NON_TENSOR = ("runtime heap at start", "other / temporaries", "allocator cache")


def _op_time(op: dict[str, Any]) -> tuple[float, str]:
    dev = op.get("self_device_us")
    if isinstance(dev, (int, float)) and dev > 0:
        return float(dev), "self device"
    cpu = op.get("self_cpu_us")
    return (float(cpu) if isinstance(cpu, (int, float)) else 0.0), "self CPU"


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
                   f"{format_bytes(alloc)} allocated at the end of forward "
                   f"({led.get('counter') or 'allocator'}).")
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


def finding(r: dict[str, Any]) -> str:
    """A paragraph generated from the data: status, speed, largest ledger line, hottest op, leaks,
    and a next hypothesis to test (docs/ARCHITECTURE.md, the method)."""
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
        out.append(f"The run ended ({reason}) after {res['steps_recorded']} steps.")
    rate = next(((res[k], unit) for k, unit in (("tokens_per_s_p50", "tokens/s"),
                                               ("samples_per_s_p50", "samples/s"))
                 if res.get(k) is not None), None)
    if rate is not None:
        s = (f"It trained at {format_rate(rate[0])} {rate[1]} (p50) with step "
             f"times of {format_ms(res['step_ms_p50'])} p50 and "
             f"{format_ms(res['step_ms_p95'])} p95")
        s += (f", an MFU of {format_pct(res['mfu'])} ({res['mfu_note']})." if res["mfu"] is not None
              else f"; no MFU ({res['mfu_note']}).")
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
        op = max(w["top_ops"], key=lambda o: _op_time(o)[0])
        t, kind = _op_time(op)
        out.append(f"In the profiler window at step {w['step']} the hottest op was "
                   f"{op.get('name')} ({t / 1000:.1f} ms {kind} over {op.get('calls')} calls).")
    leaks = [e for e in r["leaks"] if e.get("event") == "leak_suspected"]
    if leaks:
        e = leaks[0]
        s = (f"A leak was suspected at step {e.get('step')}: {e.get('counter')} grew "
             f"{format_bytes(e.get('bytes_per_step'))}/step since step {e.get('since_step')}")
        if isinstance(e.get("seconds_to_full"), (int, float)):
            s += f", full in about {format_duration(e['seconds_to_full'])}"
        s += f" ({e['hint']})." if e.get("hint") else "."
        cleared = [c for c in r["leaks"] if c.get("event") == "leak_cleared"]
        if cleared:
            s += f" It cleared at step {cleared[-1].get('step')}."
        out.append(s)
    elif any(e.get("event") == "leak_demo_started" for e in r["leaks"]):
        out.append("The leak demo ran, but no leak_suspected event was recorded.")
    else:
        out.append("No leak was suspected.")
    guard = [e for e in r["leaks"] if e.get("event") == "memory_guard"]
    if guard:
        out.append(f"The memory guard stopped the run at step {guard[-1].get('step')}.")
    if res["skipped_steps"]:
        out.append(f"{res['skipped_steps']} optimizer steps were skipped (inf/nan gradients).")
    if hypothesis:
        out.append(f"Next hypothesis: {hypothesis}.")
    return " ".join(out)


def render_markdown(r: dict[str, Any]) -> str:
    hw, sw, model, inp = r["hardware"], r["software"], r["model"], r["input"]
    res, meas = r["results"], r["measurement"]
    name = r["run_dir"].rstrip("/").split("/")[-1]
    md = [f"# memtop report: {name}", ""]
    if not r["complete"]:
        md += ["> **Incomplete run.** " + " ".join(f"{x[0].upper()}{x[1:]}."
                                                   for x in r["incomplete_reasons"]), ""]
    source = f"`{r.get('metrics_file') or 'metrics.jsonl'}`"
    if r.get("ranks"):
        source += f" (rank 0 of {r['ranks']['count']}; every rank under Ranks)"
    md += [f"Generated {r['generated_at']} from {source} ({r['rows']['steps']} step rows, "
           f"{r['rows']['events']} events).", "", "## Finding", "", r["finding"], "",
           "## Setup", ""]
    ram = f"RAM {format_bytes(hw['ram_bytes'])}"
    cpu = f"{hw['cpu_model']} ({hw['cpu_count']} cores)"
    if hw["gpu_name"]:
        hardware = (f"{hw['device']} {hw['gpu_name']} ({format_bytes(hw['device_memory_bytes'])},"
                    f" sm {hw['gpu_capability']}); host {cpu}, {ram}")
    else:
        hardware = f"{hw['device']}: {cpu}, {ram}"
    params = f", {model['params']:,} params" if isinstance(model["params"], int) else ""
    setup = [
        ["hardware", hardware],
        ["software", f"Python {sw['python']}, torch {sw['torch']}, CUDA {sw['cuda'] or 'none'}"
                     f", cuDNN {sw['cudnn'] or 'none'}, memtop {sw['memtop']}"],
        ["model", _model_text(model, params)],
        ["input", _input_text(inp)],
        ["mode", r["mode"]],
        ["amp", f"{r['amp']}: compute in {inp['compute_dtype']}"],
        ["warmup", f"{r['warmup_steps']} steps (peak counters reset after them)"],
        ["measurement", f"{meas['steps']} steps recorded "
                        f"({meas['steps_planned'] or 'no limit'} planned)"],
        ["sync rule", meas["sync_rule"]],
        ["timing", meas["timing"]],
        ["counters", f"{meas['counters']}; driver level: {meas['driver_counter']}"],
    ]
    md += [markdown_table(["field", "value"], setup), "",
           f"Software recorded at {sw['source']}.", ""]
    md += ["## Results", ""]
    results = [
        ["final loss", f"{res['final_loss']:.4f}" if res["final_loss"] is not None else None],
        ["mean loss", f"{res['mean_loss']:.4f}" if res["mean_loss"] is not None else None],
        ["tokens/s p50", format_rate(res["tokens_per_s_p50"])],
        *([["samples/s p50", format_rate(res["samples_per_s_p50"])]]
          if res.get("samples_per_s_p50") is not None else []),
        ["step time p50", format_ms(res["step_ms_p50"])],
        ["step time p95", format_ms(res["step_ms_p95"])],
        ["peak allocated", format_bytes(res["peak_allocated_bytes"])],
        ["peak reserved", format_bytes(res["peak_reserved_bytes"])],
        ["driver-level peak", format_bytes(res["driver_peak_bytes"])],
        ["skipped steps", res["skipped_steps"]],
        ["FLOPs/token", f"{res['flops_per_token']:,}" if res["flops_per_token"] else None],
        ["achieved FLOP/s", format_rate(res["achieved_flops_per_s"], "FLOP/s")],
        ["MFU", format_pct(res["mfu"])],
    ]
    if res.get("cache_free_bytes") is not None or res.get("alloc_retries") is not None:
        results += [  # CUDA only (probes/counters/cudamem.py)
            ["cache free (reserved − allocated)", format_bytes(res.get("cache_free_bytes"))],
            ["cudaMalloc retries / OOMs", f"{res.get('alloc_retries')} / {res.get('ooms')}"],
            ["NVML − reserved (context, workspaces)",
             format_bytes(res.get("driver_minus_reserved_bytes"))],
        ]
    md += [markdown_table(["metric", "value"], results, right={1}), "",
           (f"Timing statistics over {res['stats_steps']} {res['stats_over']}. "
            if res["stats_steps"] else "No step was recorded to time. ") +
           f"{res['peaks_note']}. FLOPs/token: {res['flops_formula'] or 'unknown'}. "
           f"MFU: {res['mfu_note']}." + (f" Allocator: {res['allocator_hint']}"
                                         if res.get("allocator_hint") else ""), ""]
    if r.get("ranks"):
        from probes.analysis.report.ranks import render_ranks

        md += render_ranks(r["ranks"])
    led = r.get("ledger")
    md += ["## Memory ledger", ""]
    if led:
        rows = [[ln.get("name"), format_bytes(ln.get("measured_bytes")),
                 format_bytes(ln.get("predicted_bytes"), na="-"), ln.get("formula")]
                for ln in led["lines"]]
        shape = (f" (B={led.get('batch_size')}, T={led.get('seq_len')})"
                 if led.get("batch_size") is not None else "")
        md += [f"Measured at step {led.get('sampled_step')}{shape}, snapshot at "
               f"{led.get('snapshot')}; "
               f"{led.get('measure_ms')} ms to measure.", "",
               markdown_table(["line", "measured", "predicted", "formula"], rows, right={1, 2}), ""]
        md += [f"- **{ln.get('name')}**: {ln['note']}" for ln in led["lines"] if ln.get("note")]
        total, alloc = led.get("total_measured_bytes"), led.get("allocated_bytes")
        share = (f" ({total / alloc:.1%} of allocated)" if isinstance(total, int)
                 and isinstance(alloc, int) and alloc > 0 else "")
        md += ["", f"Exact tensor lines total {format_bytes(total)}{share}; "
               f"allocated {format_bytes(led.get('allocated_bytes'))}, reserved "
               f"{format_bytes(led.get('reserved_bytes'))} at the snapshot; unexplained "
               f"{format_bytes(led.get('unexplained_bytes'))} "
               f"({format_pct(led.get('unexplained_ratio'))} of allocated).", ""]
    else:
        md += ["No ledger event was recorded.", ""]
    md += ["## Profiler windows", ""]
    if not r["profiles"]:
        md += ["No profiler window was taken.", ""]
    for w in r["profiles"]:
        if w["status"] != "done":
            md += [f"### Window at step {w['step']}: {w['status']} ({w.get('reason')})", ""]
            continue
        md += [f"### Window at step {w['step']} (sorted by {w['sort_by']}; trace in "
               f"`{w['dir']}`)", ""]
        rows = [[op.get("name"), op.get("calls"), format_us(op.get("self_cpu_us")),
                 format_us(op.get("cpu_total_us")), format_us(op.get("self_device_us")),
                 format_us(op.get("device_total_us"))] for op in w["top_ops"]]
        md += [markdown_table(["op", "calls", "self CPU", "CPU total", "self device",
                               "device total"], rows, right={1, 2, 3, 4, 5}), ""]
    md += ["## Leak and memory events", ""]
    if r["leaks"]:
        rows, hints = [], []
        for e in r["leaks"]:
            per_step = e.get("bytes_per_step") or e.get("growth_bytes_per_step")
            rows.append([e.get("step"), e.get("event"), e.get("counter") or e.get("kind"),
                         format_bytes(per_step, na="") + ("/step" if per_step else ""),
                         e.get("since_step", ""), format_duration(e.get("seconds_to_full"))])
            if e.get("hint"):
                hints.append(f"- step {e.get('step')} ({e.get('event')}): {e['hint']}")
        md += [markdown_table(["step", "event", "counter / kind", "growth", "since", "full in"],
                              rows, right={0, 3, 4, 5}), ""] + hints + [""]
    else:
        md += ["None recorded.", ""]
    if r.get("baseline"):
        md += baseline_lines(r["baseline"])
    if r["status"]["errors"]:
        md += ["## Errors", ""]
        md += [f"- step {e['step']}: {e['type']}: {e['message']}" for e in r["status"]["errors"]]
        md += [""]
    return "\n".join(md)


def _model_text(model: dict[str, Any], params: str) -> str:
    if model.get("kind", "GPT") == "GPT":
        return (f"GPT: {model['layers']} layers, dim {model['dim']}, {model['heads']} heads, "
                f"vocab {model['vocab']}, {model['attention']} attention{params}")
    return f"{model['kind']} (the training loop's own model){params}"


def _input_text(inp: dict[str, Any]) -> str:
    if "seq_len" in inp:
        return (f"B={inp['batch_size']}, T={inp['seq_len']} ({inp['tokens_per_step']} tokens/"
                f"step), {inp['token_dtype']} tokens, {inp['param_dtype']} weights")
    per_step = [f"{inp[k]} {unit}/step" for k, unit in (("tokens_per_step", "tokens"),
                                                        ("samples_per_step", "samples"))
                if inp.get(k)]
    return (", ".join(per_step) or "not reported by the loop (steps/s shown)") + \
        f", {inp['param_dtype']} weights"


def baseline_lines(b: dict[str, Any]) -> list[str]:
    """The comparison with `--baseline RUN` (tutorial exercise 8), as `memtop compare` words it."""
    from probes.analysis.compare.text import comparison_lines

    if b.get("error"):
        return ["## Against the baseline", "", f"Baseline {b['run']}: not compared ({b['error']})",
                ""]
    lines = comparison_lines(b["comparison"], b["run"])
    lines[0] = f"## Against the baseline {b['run']}"
    return lines + [f"Noise rule: {b['noise_rule']}", ""]
