"""Which module holds the memory in `memtop infer`: the last inference memory window (the `a`
key, ``--attribute-request``; docs/ATTRIBUTION.md) as a table of the blocks, then their children
over the blocks, with the KV cache each keeps and its prefill and decode forward peaks, and the
window's hints with their measured figures."""

from __future__ import annotations

from typing import Any

from probes import records as R
from probes.analysis.report.context import ReportContext, shown_fields
from probes.analysis.report.sections.attribution import opening
from probes.records.infer_attribution import at_level, blocks_level, groups, rows_of, sorted_rows
from probes.tools.tables import markdown_table
from probes.tools.units import format_bytes

COLUMNS = (("params_bytes", "params"), ("kv_cache_bytes", "KV cache"),
           ("prefill_peak_bytes", "prefill peak"), ("decode_peak_bytes", "decode peak"))


def build(ctx: ReportContext) -> dict[str, Any] | None:
    windows = ctx.metrics.named(R.INFER_ATTRIBUTION)
    cancelled = ctx.metrics.named(R.ATTRIBUTION_CANCELLED)
    if not windows and not cancelled:
        return None
    return {"infer_attribution": shown_fields(windows[-1]) if windows else None,
            "infer_attribution_windows": len(windows),
            "attribution_cancelled": [{"step": c.get("step"), "reason": c.get("reason")}
                                      for c in cancelled]}


def _cells(row: dict[str, Any]) -> list[Any]:
    return [format_bytes(row[k]) if isinstance(row.get(k), int) else "n/a" for k, _ in COLUMNS]


def table_rows(data: dict[str, Any]) -> list[list[Any]]:
    """The blocks by KV cache, then their children over the blocks (×members)."""
    rows = rows_of(data)
    level = blocks_level(rows)
    model = str(data.get("model_class") or "model")
    out = []
    for row in sorted_rows(at_level(rows, level), COLUMNS[1][0]):
        label = f"{model} (own)" if row["module"] == "(own)" else str(row["module"])
        out.append([label, *_cells(row)])
    for row in sorted_rows(groups(rows, level), COLUMNS[1][0]):
        out.append([f"{row['module']} (×{row['members']}, peaks: the largest)", *_cells(row)])
    return out


def render(section: dict[str, Any], report: dict[str, Any]) -> list[str]:
    md, data = opening(section, "infer_attribution", R.INFER_ATTRIBUTION, "memory window")
    if data is None:
        return md
    md += [f"Request {data.get('request')}'s prefill (step {data.get('prefill_step')}) and "
           f"first decode step ({data.get('decode_step', 'none')}), opened by "
           f"{data.get('trigger')}; {data.get('modules_hooked')} modules hooked. Windows in "
           f"this run: {section.get('infer_attribution_windows')}. The KV cache is measured "
           f"from its storages after {data.get('context_tokens')} positions × "
           f"B={data.get('batch_size')}; under inference_mode nothing is saved for a "
           "backward, so a module's activations are its forward peak. docs/ATTRIBUTION.md.",
           "",
           markdown_table(["module", *(t for _, t in COLUMNS)], table_rows(data),
                          right={1, 2, 3, 4}), ""]
    md.append(f"Totals: parameters {format_bytes(data.get('params_total_bytes'))}, KV cache "
              f"{format_bytes(data.get('kv_cache_total_bytes'))}; the model's forward rose "
              f"{format_bytes(data.get('prefill_step_peak_bytes'))} above its start in the "
              f"prefill and {format_bytes(data.get('decode_step_peak_bytes'))} in the decode "
              f"step ({data.get('counter')}).")
    if data.get("peak_rule"):
        md += ["", f"Forward peak: {str(data['peak_rule']).removeprefix('forward peak: ')}."]
    md += [""] + [f"- {h}" for h in data.get("hints") or []]
    return md + [""]
