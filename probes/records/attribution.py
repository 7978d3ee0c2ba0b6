"""The rows of a memory attribution window (``memory_attribution``; docs/ATTRIBUTION.md): one
row per named submodule with the bytes credited to it *itself*, so every byte sits in exactly one
row and a subtree's sum is the subtree's figure. Pure (no torch): the instrument
(probes/instruments/attribution.py) bounds its rows here, the dashboard, the report and
`memtop compare` aggregate them here.

A row: ``module`` (the name ``named_modules()`` gives it; "" is the model's own code),
``params_bytes``, ``grads_bytes``, ``optimizer_bytes``, ``activations_bytes`` (saved for
backward while the module ran, not a parameter, counted once per storage), ``forward_peak_bytes``
(the module's high-water mark above its entry, its children's work included: a property of the
module, never summed), and what the hints need: ``calls``, ``weight_copies_bytes`` (autocast
casts of parameters saved for backward), ``scores_bytes`` (T×T attention scores among its
activations), ``input_bytes`` (its largest call's tensor inputs), ``forward_ms`` (its forward's
wall time in the window), ``checkpointed`` (its activations are the inputs a checkpoint keeps).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

ROW_FIELDS: dict[str, Any] = {
    "module": "str", "params_bytes": "int", "grads_bytes": "int", "optimizer_bytes": "int",
    "activations_bytes": "int", "forward_peak_bytes": "int", "calls": "int",
    "weight_copies_bytes": "int", "scores_bytes": "int", "input_bytes": "int",
    "forward_ms": "num", "checkpointed": "bool", "folded": "int"}
# summed when rows are folded into an ancestor or aggregated to a depth
ADDITIVE = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
            "weight_copies_bytes", "scores_bytes", "calls")
HELD = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes")
OTHERS = "(others)"  # the rows a bounded event merged (no module is named so)
MAX_ROWS = 300  # rows an event keeps (~300 B each): deeper rows fold into their ancestors first
MAX_EVENT_BYTES = 256 * 1024
SORT_KEYS = ("activations_bytes", "forward_peak_bytes", "params_bytes", "grads_bytes",
             "optimizer_bytes", "held_bytes")
SORT_TITLES = {"activations_bytes": "activations", "forward_peak_bytes": "fwd peak",
               "params_bytes": "params", "grads_bytes": "grads", "optimizer_bytes": "opt",
               "held_bytes": "held"}
_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)")


def depth(name: str) -> int:
    """0 for the model's own code (""), 1 for its children, ..."""
    return 0 if not name else name.count(".") + 1


def ancestor(name: str, level: int) -> str:
    """``name``'s ancestor at ``level`` (itself when it is not deeper)."""
    return name if depth(name) <= level else ".".join(name.split(".")[:level])


def pattern(name: str) -> str:
    """The name with its numbered parts as ``*``: transformer.h.3.attn -> transformer.h.*.attn."""
    return _INDEX.sub("*", name)


def held_bytes(row: Mapping[str, Any]) -> int:
    """What a row holds at once at most: its parameters, gradients, optimizer state and
    activations (gradients and activations overlap only in part: an upper bound)."""
    return sum(int(row.get(k) or 0) for k in HELD)


def _num(row: Mapping[str, Any], key: str) -> float:
    value = row.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else 0.0


def merge(into: dict[str, Any], row: Mapping[str, Any]) -> None:
    """Add ``row``'s additive figures to ``into``; a peak stays the larger of the two."""
    for key in ADDITIVE:
        into[key] = int(_num(into, key) + _num(row, key))
    into["forward_ms"] = round(_num(into, "forward_ms") + _num(row, "forward_ms"), 4)
    peaks = [p for p in (into.get("forward_peak_bytes"), row.get("forward_peak_bytes"))
             if isinstance(p, int)]
    into["forward_peak_bytes"] = max(peaks) if peaks else None
    into["input_bytes"] = int(max(_num(into, "input_bytes"), _num(row, "input_bytes")))
    into["checkpointed"] = bool(into.get("checkpointed")) or bool(row.get("checkpointed"))


def _blank(name: str) -> dict[str, Any]:
    return {"module": name, **{k: 0 for k in ADDITIVE}, "forward_peak_bytes": None,
            "input_bytes": 0, "forward_ms": 0.0, "checkpointed": False}


def _absorb(target: dict[str, Any], row: Mapping[str, Any], itself: bool) -> None:
    """``row`` into ``target``: its bytes always; its calls, peak, time and input only when it
    is ``target``'s module itself (a descendant's are inside the ancestor's own)."""
    for key in ADDITIVE:
        if itself or key != "calls":
            target[key] = int(_num(target, key) + _num(row, key))
    target["checkpointed"] = bool(target.get("checkpointed")) or bool(row.get("checkpointed"))
    folded = int(_num(row, "folded")) + (0 if itself else 1)
    if folded:
        target["folded"] = int(_num(target, "folded")) + folded
    if itself:  # a peak not read (the read budget's depth) stays None: "n/a"
        peak = row.get("forward_peak_bytes")
        target["forward_peak_bytes"] = peak if isinstance(peak, int) else None
        target["forward_ms"] = round(_num(row, "forward_ms"), 4)
        target["input_bytes"] = int(_num(row, "input_bytes"))


def fold_to(rows: Iterable[Mapping[str, Any]], level: int) -> list[dict[str, Any]]:
    """Rows deeper than ``level`` added into their ancestor at ``level`` (its own row keeps its
    forward peak and input, the folded rows' bytes join it; ``folded`` counts them)."""
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        name = str(row.get("module", ""))
        key = ancestor(name, level)
        _absorb(out.setdefault(key, _blank(key)), row, key == name)
    return list(out.values())


def is_others(name: str) -> bool:
    """A bounded event's merged row: ``(others)``, or ``parent.(others)`` when the merged
    modules share a parent (it then aggregates under that parent)."""
    return name == OTHERS or name.endswith("." + OTHERS)


def bound_rows(rows: list[dict[str, Any]], max_rows: int = MAX_ROWS) -> list[dict[str, Any]]:
    """At most ``max_rows`` rows that add up to the same totals: the deepest level that fits
    is kept (deeper rows fold into their ancestors there); when that level is too coarse to
    tell much (under a tenth of the bound: a ModuleList of 10,000 layers folds to one row) or
    nothing fits, the level below keeps its largest ``max_rows - 1`` rows and the rest merge
    into one ``(others)`` row (``parent.(others)`` when they share a parent)."""
    if len(rows) <= max_rows:
        return rows
    deepest = max((depth(str(r.get("module", ""))) for r in rows), default=0)
    finer = rows
    for level in range(deepest - 1, 0, -1):
        folded = fold_to(rows, level)
        if len(folded) <= max_rows:
            if len(folded) >= max(2, max_rows // 10):
                return folded
            break
        finer = folded
    # the finest level's rows compete for the places; the few above them (their ancestors,
    # the model's own code) stay, so the merged rows keep their parent
    finest = max(depth(str(r.get("module", ""))) for r in finer)
    above = [r for r in finer if depth(str(r.get("module", ""))) < finest][:max_rows // 2]
    kept = {id(r) for r in above}
    deep = sorted((r for r in finer if id(r) not in kept),
                  key=lambda r: (held_bytes(r), _num(r, "forward_peak_bytes")), reverse=True)
    room = max_rows - 1 - len(above)
    keep, rest = above + deep[:room], deep[room:]
    parents_of = {str(r.get("module", "")).rpartition(".")[0] for r in rest}
    name = f"{parents_of.pop()}.{OTHERS}" if len(parents_of) == 1 and "" not in parents_of \
        else OTHERS
    others = _blank(name)
    for row in rest:
        _absorb(others, row, itself=False)
    others["forward_peak_bytes"] = 0  # a peak of unrelated modules means nothing
    return keep + [others]


def event_size(data: Mapping[str, Any]) -> int:
    """The event's bytes as a metrics.jsonl line (what MAX_EVENT_BYTES bounds)."""
    return len(json.dumps(data, separators=(", ", ": ")).encode("utf-8"))


def fit_event(data: dict[str, Any], max_bytes: int = MAX_EVENT_BYTES) -> dict[str, Any]:
    """``data`` with its rows bounded so the line stays under ``max_bytes`` (long names)."""
    limit = MAX_ROWS
    rows = data["modules"]
    while True:
        data["modules"] = bound_rows(rows, limit)
        if event_size(data) <= max_bytes or limit <= 8:
            return data
        limit //= 2


# ---- reading rows: totals, depth, the table -----------------------------------------------
def totals(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """The rows' sums of each additive figure."""
    out = dict.fromkeys(ADDITIVE, 0)
    for row in rows:
        for key in ADDITIVE:
            out[key] += int(_num(row, key))
    return out


def parents(rows: Iterable[Mapping[str, Any]]) -> set[str]:
    """The names that have rows under them ("" when the model has any submodule row)."""
    out: set[str] = set()
    for row in rows:
        name = str(row.get("module", ""))
        if name and name != OTHERS:  # (a parent.(others) row has its parent)
            parts = name.split(".")
            out.update(".".join(parts[:i]) for i in range(len(parts)))
    return out


def has_children(rows: Iterable[Mapping[str, Any]], name: str) -> bool:
    return name in parents(rows)


def at_depth(rows: list[dict[str, Any]], level: int) -> list[dict[str, Any]]:
    """Rows aggregated to ``level``: each module at that level with its subtree's bytes and its
    own peak; a shallower module with deeper modules under it keeps only its own code, named
    ``name (own)`` when it has any bytes (the model's: ``(own)``)."""
    out: dict[str, dict[str, Any]] = {}
    above = parents(rows)
    for row in rows:
        name = str(row.get("module", ""))
        key = ancestor(name, level)
        target = out.setdefault(key, _blank(key))
        _absorb(target, row, key == name)
        if key == name and not is_others(name):
            target["own"] = depth(name) < level and name in above
    result = []
    for name, row in out.items():
        if row.get("own"):
            if held_bytes(row) == 0 and not row.get("weight_copies_bytes"):
                continue  # a container's own code that holds nothing (ModuleList, Sequential)
            row["label"] = f"{name} (own)" if name else "(own)"
        result.append(row)
    return result


def choose_depth(rows: list[dict[str, Any]], share: float = 0.5, max_depth: int = 8) -> int:
    """The table's depth: go one level down while one module holds over ``share`` of the
    activations (or of all held bytes, when nothing was saved) and has modules under it — so a
    GPT shows its blocks (transformer -> transformer.h -> transformer.h.N), a flat net its
    layers."""
    level = 1
    above = parents(rows)
    key = "activations_bytes" if totals(rows)["activations_bytes"] else "held"
    while level < max_depth:
        agg = at_depth(rows, level)
        values = [held_bytes(r) if key == "held" else int(_num(r, key)) for r in agg]
        total = sum(values)
        if not total:
            return level
        top = max(range(len(agg)), key=lambda i: values[i])
        name = str(agg[top]["module"])
        if values[top] <= share * total or agg[top].get("own") or name not in above:
            return level
        level += 1
    return level


def sort_rows(rows: Iterable[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Largest first by ``key`` (SORT_KEYS); ``(others)`` always last."""
    def value(r: Mapping[str, Any]) -> float:
        return float(held_bytes(r)) if key == "held_bytes" else _num(r, key)

    rows = list(rows)
    return sorted(rows, key=lambda r: (is_others(str(r.get("module", ""))), -value(r),
                                       str(r.get("module", ""))))


def next_sort_key(key: str) -> str:
    return SORT_KEYS[(SORT_KEYS.index(key) + 1) % len(SORT_KEYS)] if key in SORT_KEYS \
        else SORT_KEYS[0]


def block_groups(rows: list[dict[str, Any]], level: int) -> list[dict[str, Any]]:
    """"Then their children": the children of the numbered modules at ``level`` (blocks),
    grouped across the blocks by pattern (transformer.h.*.attn), sums of their bytes, the
    largest peak; empty when that level has no numbered modules."""
    if not any(pattern(str(r.get("module", ""))) != str(r.get("module", ""))
               for r in at_depth(rows, level)):
        return []
    children = at_depth(rows, level + 1)
    groups: dict[str, dict[str, Any]] = {}
    for row in children:
        name = str(row.get("module", ""))
        if depth(name) != level + 1 or row.get("own") or is_others(name):
            continue
        key = pattern(name)
        if key == name or pattern(ancestor(name, level)) == ancestor(name, level):
            continue  # not under a numbered block
        target = groups.setdefault(key, _blank(key))
        merge(target, row)
        target["members"] = int(target.get("members", 0)) + 1
    return list(groups.values())


def peak_base(data: Mapping[str, Any]) -> int | None:
    """What %peak divides by: the step's peak, above the runtime heap on CPU (the heap torch
    and Python held before training is not the model's)."""
    peak, runtime = data.get("step_peak_bytes"), data.get("runtime_heap_bytes")
    if not isinstance(peak, int) or peak <= 0:
        return None
    if isinstance(runtime, int) and 0 < runtime < peak:
        return peak - runtime
    return peak


def module_label(row: Mapping[str, Any]) -> str:
    return str(row.get("label") or row.get("module") or "(own)")


__all__ = ["ADDITIVE", "HELD", "MAX_EVENT_BYTES", "MAX_ROWS", "OTHERS", "ROW_FIELDS",
           "SORT_KEYS", "SORT_TITLES", "ancestor", "at_depth", "block_groups", "bound_rows",
           "choose_depth", "depth", "event_size", "fit_event", "fold_to", "has_children",
           "held_bytes", "is_others", "merge", "module_label", "next_sort_key", "parents",
           "peak_base",
           "pattern", "sort_rows", "totals"]


# ---- the event's one line -----------------------------------------------------------------
ATTRIBUTION_FIELDS: dict[str, Any] = {
    "steps": ["int"], "warmup_steps": "int", "micro_batches": "int", "modules": [ROW_FIELDS],
    "unattributed_bytes": "int", "params_total_bytes": "int", "grads_total_bytes": "int",
    "optimizer_total_bytes": "int", "activations_total_bytes": "int",
    "weight_copies_bytes": "int", "checkpoint_inputs_bytes": "int", "step_peak_bytes": "int",
    "forward_ms": "num", "plain_forward_ms": "num", "seq_len": "int", "batch_size": "int",
    "model_class": "str", "modules_hooked": "int", "rows_folded": "int", "counter": "str",
    "peak_depth": "int", "runtime_heap_bytes": "int",
    "peak_rule": "str", "hook_ms": "num", "window_step_ms": "num", "trigger": "str",
    "hints": ["str"], "device": "str", "amp": "str", "optimizer_class": "str"}


def attribution_summary(d: Mapping[str, Any]) -> str:
    """"transformer.h.* hold 88% of 1.2 MiB of activations (top transformer.h.0 ...)"."""
    from probes.tools.units import format_bytes

    rows = [r for r in d.get("modules") or [] if isinstance(r, dict)]
    total = int(_num(d, "activations_total_bytes")) or totals(rows)["activations_bytes"]
    level = choose_depth(rows) if rows else 1
    shown = sort_rows(at_depth(rows, level), "activations_bytes")
    top = shown[0] if shown else None
    text = f"{len(rows)} modules, activations {format_bytes(total)}"
    if top is not None and total:
        share = _num(top, "activations_bytes") / total
        text += f"; most in {module_label(top)} ({share:.0%})"
    return text
