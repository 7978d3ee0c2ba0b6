"""The memory ledger as last measured: each line's measured bytes beside its formula's
prediction, and how much of the allocator's count the lines explain."""

from __future__ import annotations

from typing import Any

from probes import records as R
from probes.analysis.fit_live import live_fit, live_line, steady_peaks
from probes.analysis.report.context import ReportContext, shown_fields
from probes.records import incomplete
from probes.tools.tables import markdown_table
from probes.tools.units import format_bytes, format_pct


def build(ctx: ReportContext) -> dict[str, Any]:
    ledger = ctx.last_ledger
    live = live_fit(ledger, steady_peaks(ledger, ctx.steps)) if ledger else None
    return {"ledger": shown_fields(ledger) if ledger else None,
            "ledger_events": len(ctx.ledgers),
            "live_fit": dict(live, line=live_line(live)) if live else None}


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
    live = section.get("live_fit")
    if live:
        md += ["", f"**{live['line']}**: against {format_bytes(live['budget_bytes'])}"
               f" ({live['budget_source']}) less {live['headroom_pct']:g}% headroom, from this "
               f"run's one size: {format_bytes(live['base_bytes'])} between steps and "
               f"{format_bytes(live['step_bytes'])} a step of B={live['batch_size']} adds "
               "(the band: the sampled peak's spread; `memtop fit` measures several sizes)."]
    alive, alloc = led.get("tensors_at_snapshot_bytes"), led.get("allocated_bytes")
    if not isinstance(alive, int):  # a run recorded before the ledger said it
        alive = led.get("total_measured_bytes")
    used, held = (R.counter_name(pane, str(led.get("device") or "cpu"))
                  for pane in ("allocated", "reserved"))
    share = (f" ({alive / alloc:.1%} of {used})" if isinstance(alive, int)
             and isinstance(alloc, int) and alloc > 0 else "")
    grads = next((ln for ln in led["lines"] if ln.get("name") == "gradients"), None)
    apart = (f" (gradients, {format_bytes(grads.get('measured_bytes'))}, live only between "
             "backward and zero_grad, are measured then and not counted here)"
             if grads and grads.get("measured_bytes") else "")
    return md + ["", f"The exact tensor lines alive at the snapshot total "
                 f"{format_bytes(alive)}{share}{apart}; "
                 f"{used} {format_bytes(led.get('allocated_bytes'))}, {held} "
                 f"{format_bytes(led.get('reserved_bytes'))} at the snapshot; unexplained "
                 f"{format_bytes(led.get('unexplained_bytes'))} "
                 f"({format_pct(led.get('unexplained_ratio'))} of {used}).", ""]
