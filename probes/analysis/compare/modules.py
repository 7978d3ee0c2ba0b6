"""Which module's memory a change moved: the last memory attribution window of A and of B
(docs/ATTRIBUTION.md), aggregated to the depth A's table shows (blocks, then their children
summed over the blocks), each module's bytes B − A.

The bytes are exact counts of tensors (parameters, gradients, optimizer state, saved
activations): any difference is the change's, there is no noise to rule out; a forward peak on
CPU is a sampled heap reading and moves a little by itself. Modules only one run has are listed
as added or gone (a renamed module reads as both).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from probes import records as R
from probes.records.attribution import (
    ATTRIBUTION_FIELDS,
    HELD,
    at_depth,
    block_groups,
    choose_depth,
    module_label,
)
from probes.records.values import clean
from probes.tools.units import format_bytes

KEYS = (*HELD, "forward_peak_bytes")
SHOWN = 12  # rows compare.md lists (largest activation change first)
TITLES = {"params_bytes": "params", "grads_bytes": "grads", "optimizer_bytes": "opt",
          "activations_bytes": "activations", "forward_peak_bytes": "fwd peak"}


def last_window(events: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """A run's last ``memory_attribution`` event, its fields checked (None without one)."""
    last = None
    for event in events:
        if event.get("event") == R.MEMORY_ATTRIBUTION:
            last = event
    if last is None:
        return None
    data = clean(last, ATTRIBUTION_FIELDS)
    return data if isinstance(data.get("modules"), list) else None


def _table(rows: list[dict[str, Any]], level: int, model: str) -> dict[str, dict[str, Any]]:
    out = {(f"{model} (own)" if module_label(r) == "(own)" else module_label(r)): r
           for r in at_depth(rows, level)}
    out.update({f"{g['module']} (×{g.get('members')})": g for g in block_groups(rows, level)})
    return out


def module_changes(a: Mapping[str, Any] | None,
                   b: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Per module at A's table depth: A's and B's figures and B − A; the totals' changes. None
    when either run has no window."""
    if not a or not b:
        return None
    rows_a = [r for r in a.get("modules") or [] if isinstance(r, dict)]
    rows_b = [r for r in b.get("modules") or [] if isinstance(r, dict)]
    if not rows_a or not rows_b:
        return None
    level = choose_depth(rows_a)
    model = str(a.get("model_class") or "model")
    ta, tb = _table(rows_a, level, model), _table(rows_b, level, model)
    modules = []
    for name in list(ta) + [n for n in tb if n not in ta]:
        ra, rb = ta.get(name), tb.get(name)
        entry: dict[str, Any] = {"module": name, "status": "both" if ra and rb else (
            "gone" if ra else "added")}
        for key in KEYS:
            va = ra.get(key) if ra else None
            vb = rb.get(key) if rb else None
            entry[key] = {"a": va, "b": vb,
                          "delta": (vb or 0) - (va or 0) if isinstance(va, int) or
                          isinstance(vb, int) else None}
        modules.append(entry)
    modules.sort(key=lambda m: -abs(m["activations_bytes"]["delta"] or 0))
    totals = {}
    for key in ("params_total_bytes", "grads_total_bytes", "optimizer_total_bytes",
                "activations_total_bytes", "unattributed_bytes", "weight_copies_bytes"):
        va, vb = a.get(key), b.get(key)
        totals[key] = {"a": va, "b": vb, "delta": vb - va if isinstance(va, int)
                       and isinstance(vb, int) else None}
    return {"depth": level, "steps": {"a": a.get("steps"), "b": b.get("steps")},
            "modules": modules, "totals": totals}


def _delta(d: Mapping[str, Any]) -> str:
    delta = d.get("delta")
    if delta is None:
        return "n/a"
    if delta == 0:
        return "="
    return ("+" if delta > 0 else "") + format_bytes(delta)


def module_lines(m: Mapping[str, Any] | None) -> list[str]:
    """compare.md's lines: the totals' changes, then the modules that moved most."""
    if m is None:
        return ["- Modules: n/a (a run has no memory attribution window: press a, or give "
                "--attribute-at STEP)"]
    t = m["totals"]
    out = ["- Modules (last memory window of each; exact bytes, B − A): parameters "
           f"{_delta(t['params_total_bytes'])}, gradients {_delta(t['grads_total_bytes'])}, "
           f"optimizer {_delta(t['optimizer_total_bytes'])}, activations "
           f"{_delta(t['activations_total_bytes'])} "
           f"({format_bytes(t['activations_total_bytes']['a'])} -> "
           f"{format_bytes(t['activations_total_bytes']['b'])})"]
    moved = [x for x in m["modules"] if any(x[k]["delta"] for k in KEYS[:4])
             or x["status"] != "both"]
    if not moved:
        return out + ["  - no module's bytes changed"]
    for x in moved[:SHOWN]:
        parts = [f"{TITLES[k]} {_delta(x[k])}" for k in KEYS if x[k]["delta"]]
        where = "" if x["status"] == "both" else f" ({x['status']} in B)"
        out.append(f"  - {x['module']}{where}: " + ", ".join(parts))
    if len(moved) > SHOWN:
        out.append(f"  - … {len(moved) - SHOWN} more modules changed (compare.json has all)")
    return out
