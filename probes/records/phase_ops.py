"""An inference window's ops apart from the ranges that wrap them.

`memtop infer` runs every step under ``record_function("prefill"|"decode")`` and the profiler
wraps each traced step in ``ProfilerStep#N``, so a window's trace holds both ranges as user
annotations. Ranked by self CPU time a range is an entry like an op (its self time is the
Python and dispatch between the ops inside it), and memtop's own label can top the table. They
are the window's labels, not ops: a phase window's rows leave them out, and the places that show
the rows say so with the label's figures (``ranges_text``). Training windows keep their ranges
(forward, backward, optimizer) as entries, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from probes.records.step import PHASES
from probes.tools.units import format_us


def split_ranges(ops: Sequence[Any], phase: object) -> tuple[list[dict], list[dict]]:
    """(the ops, the ranges: rows that are user annotations). Only a phase window (``phase``
    one of PHASES) is split; any other keeps every row, in order, and no ranges."""
    rows = [op for op in ops if isinstance(op, dict)]
    if phase not in PHASES:
        return rows, []
    def is_range(op: dict) -> bool:
        return op.get("user_annotation") is True or op.get("name") in (phase, "ProfilerStep*")
    ranges = sorted((op for op in rows if is_range(op)), key=lambda op: op.get("name") != phase)
    return [op for op in rows if not is_range(op)], ranges  # the window's own label first


def ranges_text(phase: object, ranges: Sequence[Mapping[str, Any]]) -> str:
    """One sentence on the ranges left out of a phase window's rows ("" when none were)."""
    if not ranges:
        return ""
    names = " and ".join(f"`{r.get('name')}`" for r in ranges)
    own = next((r for r in ranges if r.get("name") == phase), None)
    calls = own.get("calls") if own else None
    figures = (f"; `{phase}`, memtop's label for the window's steps: {calls} "
               f"call{'' if calls == 1 else 's'}, "
               f"{format_us(own.get('cpu_total_us'))} CPU total, "
               f"{format_us(own.get('self_cpu_us'))} self, the Python between its ops"
               if own else "")
    return f"Left out of the rows: {names}, ranges that wrap the steps, not ops{figures}."
