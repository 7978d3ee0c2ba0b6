"""Text of the module memory table (tui/widgets/module_memory.py), from a ``memory_attribution``
event's data: plain functions, tested without an App (tests/unit/test_attribution_table.py).

The table shows the modules at the depth the rows choose (probes/records/attribution.py
``choose_depth``: a GPT's blocks), then the blocks' children grouped across the blocks
(``transformer.h.*.attn``), a total line and the line that reconciles it with the ledger
(parameters, gradients and optimizer state exactly; activations within 5%, the rest shown as
"not in a module"), then the window's hints.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

from probes.records.attribution import (
    SORT_TITLES,
    at_depth,
    block_groups,
    choose_depth,
    held_bytes,
    is_others,
    module_label,
    peak_base,
    sort_rows,
    totals,
)
from probes.tools.units import format_bytes
from tui.format import fit, window_text

# the table's columns: (row key, title); "share" is the row's held bytes over the step's peak
COLUMNS = (("params_bytes", "params"), ("grads_bytes", "grads"), ("optimizer_bytes", "opt"),
           ("activations_bytes", "acts"), ("forward_peak_bytes", "fwd peak"),
           ("share", "%peak"))
CELL_W = 9
NAME_MIN = 12
ACTS_TOLERANCE = 0.05  # the activations' total against the ledger's measured line


def cell(key: str, row: Mapping[str, Any], step_peak: int | None) -> str:
    """One cell: bytes, or the row's share of the step's peak ("n/a" when unknown)."""
    if key == "share":
        if not step_peak:
            return "n/a"
        share = held_bytes(row) / step_peak
        return f"{share:.0%}" if share >= 0.01 else ("<1%" if share > 0 else "0%")
    value = row.get(key)
    if key == "forward_peak_bytes" and is_others(str(row.get("module", ""))):
        return ""
    return format_bytes(value) if isinstance(value, (int, float)) else "n/a"


# the sort key (probes/records/attribution.py SORT_KEYS) -> the column that shows it: "held"
# is what %peak is a share of (a held sort showed no ▼ and could lose its column, issue 40)
SORT_COLUMN = {"held_bytes": "share"}


def sort_column(sort_key: str) -> str:
    """The column whose values a sort by ``sort_key`` orders."""
    return SORT_COLUMN.get(sort_key, sort_key)


def shown_columns(width: int, sort_key: str) -> list[tuple[str, str]]:
    """The columns that fit beside a name of NAME_MIN cells; the sort column always stays,
    then activations, fwd peak, params, opt, grads, %peak in that order."""
    order = ["activations_bytes", "forward_peak_bytes", "params_bytes", "optimizer_bytes",
             "grads_bytes", "share"]
    sort_key = sort_column(sort_key)
    if sort_key in order:
        order.remove(sort_key)
        order.insert(0, sort_key)
    room = max(0, (width - NAME_MIN) // (CELL_W + 1))
    keep = set(order[:room])
    return [c for c in COLUMNS if c[0] in keep]


def sort_title(title: str) -> str:
    """The sort column's title with its marker, within a cell: "acts ▼", "fwd peak▼"."""
    return f"{title} ▼" if len(title) + 2 <= CELL_W else f"{title[:CELL_W - 1]}▼"


def short_name(name: str, width: int) -> str:
    """A module name that fits, its end kept (the block and its part say most): "…h.0.attn"."""
    if len(name) <= width:
        return name
    return "…" + name[-(width - 1):] if width > 1 else name[:width]


def _line(label: str, cells: list[str], name_w: int) -> str:
    return f"{short_name(label, name_w):<{name_w}}" + "".join(f" {c:>{CELL_W}}" for c in cells)


def table_lines(data: Mapping[str, Any], sort_key: str, width: int,
                ledger: Mapping[str, Any] | None = None) -> list[str]:
    """Every line of the table for a terminal ``width`` columns wide."""
    rows = [r for r in data.get("modules") or [] if isinstance(r, dict)]
    if not rows:
        return ["no module rows in this window"]
    step_peak = peak_base(data)
    columns = shown_columns(width, sort_key)
    name_w = max(NAME_MIN, width - len(columns) * (CELL_W + 1))
    model = str(data.get("model_class") or "model")
    level = choose_depth(rows)
    lines = [_line("module", [sort_title(t) if k == sort_column(sort_key) else t
                              for k, t in columns],
                   name_w)]
    for row in sort_rows(at_depth(rows, level), sort_key):
        label = module_label(row)
        if label == "(own)":
            label = f"{model} (own)"
        lines.append(_line(label, [cell(k, row, step_peak) for k, _ in columns], name_w))
    groups = block_groups(rows, level)
    if groups:
        members = max(int(g.get("members", 0)) for g in groups)
        blocks = str(groups[0]["module"]).rsplit("*", 1)[0] + "*"  # transformer.h.*
        lines.append(fit(f"their children, summed over the {members} blocks {blocks}:",
                         width))
        for row in sort_rows(groups, sort_key):  # "*.attn": each block's attn, summed
            child = "*" + str(row["module"])[len(blocks):]
            lines.append(_line(" " + child, [cell(k, row, step_peak) for k, _ in columns],
                               name_w))
    sums = dict(totals(rows), activations_bytes=int(data.get("activations_total_bytes") or 0))
    total_row = dict(sums, forward_peak_bytes=None, module="total")
    total_cells = [cell(k, total_row, step_peak) if k != "forward_peak_bytes" else ""
                   for k, _ in columns]
    lines.append(_line("total", total_cells, name_w))
    for text in footer_lines(data, ledger):  # hints wrap: they are the table's point
        if text.startswith("• "):
            lines += textwrap.wrap(text, width, subsequent_indent="  ") or [""]
        else:
            lines.append(fit(text, width))
    return lines


def ledger_check(data: Mapping[str, Any], ledger: Mapping[str, Any] | None) -> str:
    """"ledger: params = grads = opt = acts 9.1 MiB vs 9.1 MiB (+0.0%)": the totals against
    the ledger's measured lines (the same shapes: a ledger measured at another step)."""
    if not ledger:
        return "ledger: not measured yet (it samples a step after warmup)"
    lines = {ln.get("name"): ln.get("measured_bytes") for ln in ledger.get("lines") or []
             if isinstance(ln, dict)}
    parts = []
    for key, name, short in (("params_total_bytes", "parameters", "params"),
                             ("grads_total_bytes", "gradients", "grads"),
                             ("optimizer_total_bytes", "optimizer state", "opt")):
        ours, theirs = data.get(key), lines.get(name)
        if isinstance(ours, int) and isinstance(theirs, int):
            parts.append(f"{short} {'=' if ours == theirs else '≠ ' + format_bytes(theirs)}")
    ours, theirs = data.get("activations_total_bytes"), lines.get("saved activations")
    if isinstance(ours, int) and isinstance(theirs, int):
        off = (ours - theirs) / theirs if theirs else 0.0
        mark = "✓" if abs(off) <= ACTS_TOLERANCE else "✗"
        parts.append(f"acts {format_bytes(ours)} vs {format_bytes(theirs)} ({off:+.1%} {mark})")
    return "ledger: " + (", ".join(parts) if parts else "n/a")


def footer_lines(data: Mapping[str, Any], ledger: Mapping[str, Any] | None) -> list[str]:
    """Under the total: what is in no module, the autocast copies, the ledger, the hints."""
    out = []
    extra = [f"not in a module {format_bytes(data.get('unattributed_bytes'))}"]
    if data.get("weight_copies_bytes"):
        extra.append(f"autocast weight copies {format_bytes(data.get('weight_copies_bytes'))}")
    if data.get("checkpoint_inputs_bytes"):
        extra.append(f"kept by checkpoints {format_bytes(data.get('checkpoint_inputs_bytes'))}")
    if isinstance(data.get("micro_batches"), int) and data["micro_batches"] > 1:
        extra.append(f"activations of 1 of {data['micro_batches']} micro-batches")
    runtime = data.get("runtime_heap_bytes")
    if isinstance(runtime, int) and runtime and peak_base(data) != data.get("step_peak_bytes"):
        extra.append(f"%peak: of the step's peak above the runtime heap "
                     f"({format_bytes(runtime)})")
    out.append(" · ".join(extra))
    out.append(ledger_check(data, ledger))
    out += [f"• {h}" for h in data.get("hints") or [] if isinstance(h, str)]
    return out


def table_title(step: int, data: Mapping[str, Any], sort_key: str) -> str:
    steps = data.get("steps") or []
    where = f"step {steps[0]}" if len(steps) == 1 else (
        f"steps {steps[0]}–{steps[-1]}" if steps else f"step {step}")
    partial = " (partial)" if data.get("partial") else ""
    return f"modules · {where}{partial} · by {SORT_TITLES.get(sort_key, sort_key)} (o)"


def attribution_text(phase: str | None, requested: bool, available: bool,
                     done_step: int | None) -> str:
    """The attribution window's part of the status line."""
    return window_text("modules", phase, requested, available,
                       f"done at step {done_step}" if done_step is not None else None)
