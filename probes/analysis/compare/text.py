"""Words for `memtop compare`: compare.md (also what the terminal shows) from compare_runs()."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from probes.analysis.compare.modules import module_lines
from probes.analysis.compare.phases import phase_lines
from probes.analysis.compare.stats import speed_verdict
from probes.records.names import counter_names, peak_name
from probes.tools.tables import markdown_table
from probes.tools.units import format_bytes, format_duration, format_ms, format_rate


def _band(b: dict[str, Any] | None, fmt: Any) -> str:
    if b is None:
        return "n/a"
    return f"{fmt(b['median'])} [{fmt(b['p25'])}-{fmt(b['p75'])}]"


def _pct(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{(ratio - 1) * 100:+.1f}%"


def _loss(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def run_rows(runs: list[dict[str, Any]]) -> list[str]:
    """One column per run (A first), one row per figure: fits 80 columns for a few runs."""
    tags = [f"{'A' if i == 0 else chr(ord('A') + i)}: {Path(r['run_dir']).name}"
            for i, r in enumerate(runs)]
    devices = [str(r.get("device") or "cpu") for r in runs]  # the peaks' names follow them
    figures = [
        ("outcome", lambda r: r["outcome"]), ("steps", lambda r: str(r["steps"])),
        ("amp", lambda r: str(r["amp"] or "n/a")),
        ("tokens/s p50 [p25-p75]", lambda r: _band(r["tokens_per_s"], format_rate)),
        ("step time p50 [p25-p75]", lambda r: _band(r["step_ms"], format_ms)),
        ("step time p95", lambda r: format_ms(r["step_ms_p95"])),
        *((peak_name(pane, *devices), lambda r, key=key: format_bytes(r[key])) for pane, key in
          (("allocated", "peak_allocated_bytes"), ("reserved", "peak_reserved_bytes"),
           ("driver", "driver_peak_bytes"))),
        ("skipped steps", lambda r: str(r["skipped_steps"])),
        ("final loss", lambda r: _loss(r["final_loss"]))]
    return markdown_table(["", *tags],
                          [[name, *(f(r) for r in runs)] for name, f in figures]).split("\n")


def _agreement_lines(loss: dict[str, Any]) -> list[str]:
    tol, win = loss["tolerance"], loss["window"]
    if loss["agree"] is None:
        return ["- Loss curves: no common steps with a finite loss"]
    head = (f"- Loss curves ({win}-step mean, {loss['common_steps']} common steps, tolerance "
            f"{tol:.1%} of A): ")
    if loss["agree"]:
        return [head + f"agree; largest gap {loss['max_rel_diff']:.2%}, at the end "
                       f"{loss['final_rel_diff']:.2%} (A {_loss(loss['final_a'])}, "
                       f"B {_loss(loss['final_b'])})"]
    return [head + f"PART at step {loss['parted_at_step']} (A {_loss(loss['loss_a_at_part'])}, "
                   f"B {_loss(loss['loss_b_at_part'])}); largest gap "
                   f"{loss['max_rel_diff']:.2%}, at the end {loss['final_rel_diff']:.2%}"]


def comparison_lines(c: dict[str, Any], base: str) -> list[str]:
    name = Path(c["run"]).name
    out = [f"## {name} against {base}", ""]
    if c.get("same_folder"):
        out.append(f"- Changed: nothing: both sides are the same folder ({c['run']}), so every "
                   "figure is compared with itself; an A/A comparison needs a second run of the "
                   "same config")
    elif c["changed"]:
        out.append("- Changed: " + "; ".join(f"{x['name']} {x['a']!r} -> {x['b']!r}"
                                             for x in c["changed"]))
    else:
        out.append("- Changed: no option of config.json (an A/A comparison, unless the code "
                   "changed: with the code the same, what remains is run-to-run noise)")
    if c["warning"]:
        out.append(f"- WARNING: {c['warning']}")
    out.append(f"- tokens/s: {c['tokens_per_s_verdict']}")
    out.append(f"- step time: {c['step_ms_verdict']}")
    peaks = c["peaks"]
    devices = [str(d) for d in (c.get("devices") or {}).values() if d]  # the names follow them
    out.append("- Peaks: " + "; ".join(
        f"{counter_names(pane, *devices)} {format_bytes(peaks[k]['a'])} -> "
        f"{format_bytes(peaks[k]['b'])} ({_pct(peaks[k]['ratio'])})"
        for pane, k in (("allocated", "peak_allocated_bytes"),
                        ("reserved", "peak_reserved_bytes"), ("driver", "driver_peak_bytes"))))
    sk = c["skipped_steps"]
    out.append(f"- Skipped steps (inf/nan gradients): {sk['a']} -> {sk['b']}")
    pc = c["precision_check"]
    if pc is not None:
        out.append(f"- Precision check (tutorial §6.2), amp {pc['amp'][0]} -> {pc['amp'][1]}:")
        for side in ("a", "b"):
            label = "A" if side == "a" else "B"
            finite = "finite" if pc["finite"][side] else f"FAILED ({pc['errors'][side]})"
            dec = {True: "goes down", False: "does NOT go down",
                   None: "too short to tell"}[pc["decreasing"][side]]
            out.append(f"  - {label}: loss {finite}, {dec}")
        out.extend("  " + line for line in _agreement_lines(pc["agreement"]))
    else:
        out.extend(_agreement_lines(c["loss"]))
    if c.get("fit"):
        out.extend(fit_compare_lines(c["fit"]))
    if "phases" in c:
        out.extend(phase_lines(c["phases"]))
    if "modules" in c:
        out.extend(module_lines(c["modules"]))
    if c.get("profiler"):
        out.extend(profiler_lines(c["profiler"]))
    return out + [""]


def fit_compare_lines(fit: dict[str, Any]) -> list[str]:
    """`memtop fit`'s answers side by side (fit.json): what the change did to the limit."""
    out = ["- Will it fit (fit.json):"]
    for side, label in (("a", "A"), ("b", "B")):
        f = fit.get(side)
        if not f:
            out.append(f"  - {label}: no fit.json")
        elif f.get("error"):
            out.append(f"  - {label}: {f['error']}")
        elif not f.get("headline"):  # no answer: why, in its own words
            out.append(f"  - {label}: {f.get('no_answer') or f.get('fit_error') or 'no fit'} "
                       f"(budget {format_bytes(f.get('budget_bytes'))})")
        else:
            out.append(f"  - {label}: {f['headline']} under "
                       f"{format_bytes(f.get('budget_bytes'))} less "
                       f"{f.get('headroom_pct') or 0:g}%; today's size predicted at "
                       f"{format_bytes(f.get('today_peak_bytes'))}")
    a, b = fit.get("a") or {}, fit.get("b") or {}
    for key, name in (("largest_batch", "largest B"), ("largest_seq", "largest T")):
        if a.get(key) and b.get(key):
            out.append(f"  - {name}: {a[key]} -> {b[key]} ({_pct(b[key] / a[key])})")
    if a.get("budget_bytes") and b.get("budget_bytes") and a["budget_bytes"] != b["budget_bytes"]:
        out.append("  - the budgets differ: the sizes answer different questions")
    return out


def profiler_lines(p: dict[str, Any]) -> list[str]:
    """Profiler windows side by side: what record_shapes / profile_memory cost (exercise 5)."""
    out = ["- Profiler windows (active steps; the last one also writes the trace):"]
    for side, label in (("a", "A"), ("b", "B")):
        w = p[side]
        if w is None:
            out.append(f"  - {label}: no window")
            continue
        shapes = "/".join("on" if x else "off" for x in w["record_shapes"])
        out.append(f"  - {label}: {w['windows']} window(s), record_shapes {shapes}; active step "
                   f"ms {_band(w['active_step_ms'], format_ms)}; export "
                   f"{format_duration(w['export_s'])}, analysis "
                   f"{format_duration(w['analysis_s'])}, trace "
                   f"{format_bytes(w['trace_bytes'])}")
    if p["active_step_ms"] is not None:
        out.append("  - active step time: " + speed_verdict(p["active_step_ms"],
                                                            higher_is_better=False))
    return out


def render_markdown(result: dict[str, Any], charts: list[tuple[str, str]] | None = None) -> str:
    """compare.md: the runs side by side, each against the baseline, the charts, the rules."""
    base = Path(result["baseline"]["run_dir"]).name
    lines = ["# memtop compare", "", f"Baseline (A): {result['baseline']['run_dir']}", ""]
    lines += run_rows([result["baseline"], *result["runs"]]) + [""]
    noise = result.get("run_to_run_noise")
    if noise:
        parts = [f"{label} ±{noise[k]:.1%}" for label, k in (("tokens/s", "tokens_per_s"),
                                                             ("step time", "step_ms"))
                 if noise.get(k) is not None]
        lines += [f"Run-to-run noise from the repeated baseline ({', '.join(noise['from'])}): "
                  f"{', '.join(parts)}; a change within it is called no measurable "
                  "difference.", ""]
    for c in result["comparisons"]:
        lines += comparison_lines(c, base)
    for title, text in charts or []:
        lines += [f"## {title}", "", "```", text.rstrip(), "```", ""]
    lines += ["## How this was measured", "", f"- Speed: {result['noise_rule']}",
              f"- Loss agreement: the trailing 10-step mean loss of each run, over the steps "
              f"both recorded; they agree when every gap is within "
              f"{result['loss_tolerance']:.1%} of A's value (per-step equality is not expected "
              "across precisions).",
              "- Peaks: allocated and reserved after the warmup reset (CPU: sampled heap), "
              "driver over the whole run."]
    return "\n".join(lines) + "\n"
