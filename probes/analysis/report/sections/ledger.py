"""The memory ledger as last measured: each line's measured bytes beside its formula's
prediction, and how much of the allocator's count the lines explain."""

from __future__ import annotations

from typing import Any

from probes import records as R
from probes.analysis.report.context import ReportContext, shown_fields
from probes.records import incomplete
from probes.tools.tables import markdown_table
from probes.tools.units import format_bytes, format_pct


def build(ctx: ReportContext) -> dict[str, Any]:
    ledger = ctx.last_ledger
    return {"ledger": shown_fields(ledger) if ledger else None,
            "ledger_events": len(ctx.ledgers)}


def render(section: dict[str, Any], report: dict[str, Any]) -> list[str]:
    led = section["ledger"]
    md = ["## Memory ledger", ""]
    if not led:
        return md + ["No ledger event was recorded.", ""]
    rows = [[ln.get("name"), format_bytes(ln.get("measured_bytes")),
             format_bytes(ln.get("predicted_bytes"), na="-"), ln.get("formula")]
            for ln in led["lines"]]
    shape = (f" (B={led.get('batch_size')}, T={led.get('seq_len')})"
             if led.get("batch_size") is not None else "")
    when = incomplete(R.LEDGER, led) or (
        f"Measured at step {led.get('sampled_step')}{shape}, snapshot at {led.get('snapshot')}; "
        f"{led.get('measure_ms')} ms to measure.")
    md += [when, "",
           markdown_table(["line", "measured", "predicted", "formula"], rows, right={1, 2}), ""]
    md += [f"- **{ln.get('name')}**: {ln['note']}" for ln in led["lines"] if ln.get("note")]
    total, alloc = led.get("total_measured_bytes"), led.get("allocated_bytes")
    share = (f" ({total / alloc:.1%} of allocated)" if isinstance(total, int)
             and isinstance(alloc, int) and alloc > 0 else "")
    return md + ["", f"Exact tensor lines total {format_bytes(total)}{share}; "
                 f"allocated {format_bytes(led.get('allocated_bytes'))}, reserved "
                 f"{format_bytes(led.get('reserved_bytes'))} at the snapshot; unexplained "
                 f"{format_bytes(led.get('unexplained_bytes'))} "
                 f"({format_pct(led.get('unexplained_ratio'))} of allocated).", ""]
