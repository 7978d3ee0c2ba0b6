"""Which module holds the memory: the last memory attribution window (the `a` key,
``--attribute-at``, ``Monitor.request_attribution``; docs/ATTRIBUTION.md) as a table at the
depth its rows choose (blocks, then their children summed over the blocks), its totals against
the ledger, and its hints with the measured figures."""

from __future__ import annotations

from typing import Any

from probes import records as R
from probes.analysis.report.context import ReportContext, shown_fields
from probes.records import incomplete
from probes.records.attribution import (
    SORT_KEYS,
    at_depth,
    block_groups,
    choose_depth,
    held_bytes,
    module_label,
    peak_base,
    sort_rows,
)
from probes.tools.tables import markdown_table
from probes.tools.units import format_bytes

COLUMNS = (("params_bytes", "params"), ("grads_bytes", "grads"), ("optimizer_bytes", "opt"),
           ("activations_bytes", "activations"), ("forward_peak_bytes", "fwd peak"))
ACTS_TOLERANCE = 0.05


def build(ctx: ReportContext) -> dict[str, Any] | None:
    windows = ctx.metrics.named(R.MEMORY_ATTRIBUTION)
    cancelled = ctx.metrics.named(R.ATTRIBUTION_CANCELLED)
    if not windows and not cancelled:
        return None
    last = windows[-1] if windows else None
    ledger = ctx.last_ledger
    check = None
    if last is not None and ledger is not None:
        lines = {ln.get("name"): ln.get("measured_bytes") for ln in ledger["lines"]
                 if isinstance(ln, dict)}
        check = {"params": (last.get("params_total_bytes"), lines.get("parameters")),
                 "grads": (last.get("grads_total_bytes"), lines.get("gradients")),
                 "optimizer": (last.get("optimizer_total_bytes"),
                               lines.get("optimizer state")),
                 "activations": (last.get("activations_total_bytes"),
                                 lines.get("saved activations")),
                 "ledger_step": ledger.get("sampled_step")}
    return {"attribution": shown_fields(last) if last else None,
            "attribution_windows": len(windows),
            "attribution_cancelled": [{"step": c.get("step"), "reason": c.get("reason")}
                                      for c in cancelled],
            "attribution_ledger_check": check}


def _cells(row: dict[str, Any]) -> list[Any]:
    return [format_bytes(row.get(k)) for k, _ in COLUMNS]


def table_rows(data: dict[str, Any]) -> list[list[Any]]:
    """The report's rows: the chosen depth sorted by activations, then the blocks' children."""
    rows = [r for r in data.get("modules") or [] if isinstance(r, dict)]
    level = choose_depth(rows)
    model = str(data.get("model_class") or "model")
    peak = peak_base(data)  # above the runtime heap on CPU
    out = []
    for row in sort_rows(at_depth(rows, level), SORT_KEYS[0]):
        label = module_label(row)
        share = (f"{held_bytes(row) / peak:.1%}" if isinstance(peak, int) and peak else "-")
        out.append([f"{model} (own)" if label == "(own)" else label, *_cells(row), share])
    for row in sort_rows(block_groups(rows, level), SORT_KEYS[0]):
        out.append([f"{row['module']} (×{row.get('members')})", *_cells(row), "-"])
    return out


def _check_text(check: dict[str, Any] | None) -> str:
    if not check:
        return "No ledger was measured in this run to check the totals against."
    parts = []
    for name in ("params", "grads", "optimizer"):
        ours, theirs = check[name]
        if isinstance(ours, int) and isinstance(theirs, int):
            parts.append(f"{name} {'equal' if ours == theirs else 'DIFFER'} "
                         f"({format_bytes(ours)} vs {format_bytes(theirs)})")
    ours, theirs = check["activations"]
    if isinstance(ours, int) and isinstance(theirs, int) and theirs:
        off = (ours - theirs) / theirs
        parts.append(f"activations {format_bytes(ours)} vs the ledger's saved activations "
                     f"{format_bytes(theirs)} ({off:+.1%}, "
                     f"{'within' if abs(off) <= ACTS_TOLERANCE else 'OUTSIDE'} 5%)")
    return (f"Against the ledger (step {check.get('ledger_step')}, the same shapes): "
            + "; ".join(parts) + ".")


def opening(section: dict[str, Any], key: str, kind: str, what: str) \
        -> tuple[list[str], dict[str, Any] | None]:
    """The section's title and the window's data; where no window finished (the cancelled
    ones' reasons) or its event lacks a field, the whole section and None. Shared with
    `memtop infer`'s section (infer_attribution.py)."""
    md = ["## Which module holds the memory", ""]
    data = section.get(key)
    if not data:
        reasons = "; ".join(f"step {c['step']}: {c['reason']}"
                            for c in section.get("attribution_cancelled") or [])
        return md + [f"No {what} finished ({reasons}).", ""], None
    text = incomplete(kind, data)
    if text:
        return md + [text, ""], None
    return md, data


def render(section: dict[str, Any], report: dict[str, Any]) -> list[str]:
    md, data = opening(section, "attribution", R.MEMORY_ATTRIBUTION,
                       "memory attribution window")
    if data is None:
        return md
    steps = data.get("steps") or []
    md += [f"Window of {len(steps)} measured step(s) ({', '.join(map(str, steps))}) after "
           f"{data.get('warmup_steps')} warm-up, opened by {data.get('trigger')}; "
           f"{data.get('modules_hooked')} modules hooked, {data.get('micro_batches')} "
           f"micro-batch(es) a step (activations: the largest one's). Windows in this run: "
           f"{section.get('attribution_windows')}. docs/ATTRIBUTION.md says how each figure "
           "is measured.", "",
           markdown_table(["module", *(t for _, t in COLUMNS), "% of peak"],
                          table_rows(data), right={1, 2, 3, 4, 5, 6}), ""]
    md.append(f"Totals: parameters {format_bytes(data.get('params_total_bytes'))}, gradients "
              f"{format_bytes(data.get('grads_total_bytes'))}, optimizer state "
              f"{format_bytes(data.get('optimizer_total_bytes'))}, activations "
              f"{format_bytes(data.get('activations_total_bytes'))} of which not in a module "
              f"{format_bytes(data.get('unattributed_bytes'))}; autocast weight copies "
              f"{format_bytes(data.get('weight_copies_bytes'))}; step peak "
              f"{format_bytes(data.get('step_peak_bytes'))} ({data.get('counter')})"
              + (f"; % of peak is of the step's peak above the runtime heap "
                 f"({format_bytes(data.get('runtime_heap_bytes'))}, what torch and Python held "
                 "before training)" if peak_base(data) != data.get("step_peak_bytes") else "")
              + ".")
    md += ["", _check_text(section.get("attribution_ledger_check")), ""]
    if data.get("peak_rule"):
        md += [f"Forward peak: {str(data['peak_rule']).removeprefix('forward peak: ')}.", ""]
    md += [f"- {h}" for h in data.get("hints") or []]
    return md + [""]
