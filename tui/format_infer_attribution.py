"""Text of `memtop infer`'s module memory table (tui/widgets/module_memory.py), from an
``infer_attribution`` event's data (probes/records/infer_attribution.py): plain functions,
tested without an App (tests/unit/test_infer_attribution.py).

The table shows the blocks (or a flat model's layers) with their parameters, the KV cache they
keep and their forward peaks in the measured prefill and decode steps, then the blocks'
children summed across the blocks (``transformer.h.*.attn``: where the cache sits), a total
line, and the window's hints.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

from probes.records.infer_attribution import (
    at_level,
    blocks_level,
    groups,
    rows_of,
    sorted_rows,
)
from probes.tools.units import format_bytes
from tui.format import fit
from tui.format_attribution import CELL_W, NAME_MIN, short_name, sort_title

COLUMNS = (("params_bytes", "params"), ("kv_cache_bytes", "KV cache"),
           ("prefill_peak_bytes", "pf peak"), ("decode_peak_bytes", "dec peak"))
SORT_KEYS = ("kv_cache_bytes", "prefill_peak_bytes", "decode_peak_bytes", "params_bytes")
SORT_TITLES = dict(COLUMNS)


def next_sort_key(key: str) -> str:
    return SORT_KEYS[(SORT_KEYS.index(key) + 1) % len(SORT_KEYS)] if key in SORT_KEYS \
        else SORT_KEYS[0]


def _cell(row: Mapping[str, Any], key: str) -> str:
    value = row.get(key)
    return format_bytes(value) if isinstance(value, int) else "n/a"


def shown_columns(width: int, sort_key: str) -> list[tuple[str, str]]:
    """The columns that fit beside a name of NAME_MIN cells, the sort column first to stay."""
    order = [k for k, _ in COLUMNS]
    if sort_key in order:
        order.remove(sort_key)
        order.insert(0, sort_key)
    keep = set(order[:max(0, (width - NAME_MIN) // (CELL_W + 1))])
    return [c for c in COLUMNS if c[0] in keep]


def _line(label: str, cells: list[str], name_w: int) -> str:
    return f"{short_name(label, name_w):<{name_w}}" + "".join(f" {c:>{CELL_W}}" for c in cells)


def table_lines(data: Mapping[str, Any], sort_key: str, width: int) -> list[str]:
    """Every line of the table for a terminal ``width`` columns wide."""
    rows = rows_of(data)
    if not rows:
        return ["no module rows in this window"]
    columns = shown_columns(width, sort_key)
    name_w = max(NAME_MIN, width - len(columns) * (CELL_W + 1))
    level = blocks_level(rows)
    model = str(data.get("model_class") or "model")
    lines = [_line("module", [sort_title(t) if k == sort_key else t for k, t in columns],
                   name_w)]
    for row in sorted_rows(at_level(rows, level), sort_key):
        label = f"{model} (own)" if row["module"] == "(own)" else str(row["module"])
        lines.append(_line(label, [_cell(row, k) for k, _ in columns], name_w))
    grouped = groups(rows, level)
    if grouped:
        members = max(int(g["members"]) for g in grouped)
        lines.append(fit(f"their children, over the {members} blocks (peaks: the largest):",
                         width))
        for row in sorted_rows(grouped, sort_key):
            lines.append(_line(" " + str(row["module"]), [_cell(row, k) for k, _ in columns],
                               name_w))
    total = {"params_bytes": data.get("params_total_bytes"),
             "kv_cache_bytes": data.get("kv_cache_total_bytes"),
             "prefill_peak_bytes": data.get("prefill_step_peak_bytes"),
             "decode_peak_bytes": data.get("decode_step_peak_bytes")}
    lines.append(_line("total", [_cell(total, k) for k, _ in columns], name_w))
    context = data.get("context_tokens")
    lines += textwrap.wrap(f"cache after {context} positions × B={data.get('batch_size')}; "
                           "peaks: each forward's rise above its entry (the total's: the "
                           "model's)", width)
    for hint in data.get("hints") or []:
        if isinstance(hint, str):
            lines += textwrap.wrap(f"• {hint}", width, subsequent_indent="  ") or [""]
    return lines


def table_title(step: int, data: Mapping[str, Any], sort_key: str) -> str:
    steps = [s for s in data.get("steps") or [] if isinstance(s, int)]
    where = (f"steps {steps[0]}–{steps[-1]}" if len(steps) > 1 else
             f"step {steps[0] if steps else step}")
    return (f"modules · request {data.get('request', '?')}, {where} · by "
            f"{SORT_TITLES.get(sort_key, sort_key)} (o)")


__all__ = ["COLUMNS", "SORT_KEYS", "next_sort_key", "table_lines", "table_title"]
