"""The rows of an inference memory window (``infer_attribution``; docs/ATTRIBUTION.md, "In
`memtop infer`"): which module holds the KV cache and how high each module's forward goes in a
prefill and in a decode step of one request. Pure (no torch): the window
(probes/instruments/infer_attribution.py) builds its rows and hints here, the dashboard, headless
output and the report read them here.

A row: ``module`` (its ``named_modules()`` name; "" is the model's own code), ``params_bytes``
(its own parameters, a tied weight once), ``kv_cache_bytes`` (the cache storages its forward
keeps, after the measured decode step), ``prefill_peak_bytes`` / ``decode_peak_bytes`` (its
high-water mark above its entry in that step's forward, children included: a property of the
module, never summed; None where not read), ``prefill_ms`` / ``decode_ms`` (its forward's wall
time in that step). Under inference_mode nothing is saved for a backward: a module's activations
are its transient forward peak, which is what the peaks are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from probes.records.attribution import ancestor, depth, pattern
from probes.tools.units import format_bytes

INFER_ROW_FIELDS: dict[str, Any] = {
    "module": "str", "params_bytes": "int", "kv_cache_bytes": "int",
    "prefill_peak_bytes": "int", "decode_peak_bytes": "int", "prefill_ms": "num",
    "decode_ms": "num", "calls": "int"}
INFER_ATTRIBUTION_FIELDS: dict[str, Any] = {
    "request": "int", "steps": ["int"], "prefill_step": "int", "decode_step": "int",
    "modules": [INFER_ROW_FIELDS], "batch_size": "int", "prompt_len": "int",
    "context_tokens": "int", "block_size": "int", "attention": "str",
    "params_total_bytes": "int", "kv_cache_total_bytes": "int",
    "prefill_step_peak_bytes": "int", "decode_step_peak_bytes": "int", "counter": "str",
    "peak_rule": "str", "modules_hooked": "int", "hook_ms": "num", "trigger": "str",
    "hints": ["str"], "device": "str", "amp": "str", "model_class": "str"}
SUMMED = ("params_bytes", "kv_cache_bytes")
PEAKS = ("prefill_peak_bytes", "decode_peak_bytes")
BLOCKS_LEVEL_MAX = 6


def _int(row: Mapping[str, Any], key: str) -> int:
    value = row.get(key)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _peak(row: Mapping[str, Any], key: str) -> int | None:
    value = row.get(key)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def rows_of(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [r for r in data.get("modules") or [] if isinstance(r, dict)]


def blocks_level(rows: list[dict[str, Any]]) -> int:
    """The table's depth: the first level with numbered modules (a GPT's transformer.h.N),
    else 1 (a flat model's layers)."""
    for level in range(1, BLOCKS_LEVEL_MAX + 1):
        names = {ancestor(str(r.get("module", "")), level) for r in rows}
        if any(depth(n) == level and pattern(n) != n for n in names):
            return level
    return 1


def fold(rows: Iterable[Mapping[str, Any]], level: int) -> dict[str, dict[str, Any]]:
    """Rows deeper than ``level`` added into their ancestor there: parameters and cache summed,
    the ancestor's own peaks, times and calls kept (a peak is never summed)."""
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        name = str(row.get("module", ""))
        key = ancestor(name, level)
        target = out.setdefault(key, {"module": key, **dict.fromkeys(SUMMED, 0),
                                      **dict.fromkeys(PEAKS)})
        if key == name:
            target.update({k: v for k, v in row.items() if k not in SUMMED})
        for k in SUMMED:
            target[k] += _int(row, k)
    return out


def at_level(rows: list[dict[str, Any]], level: int) -> list[dict[str, Any]]:
    """Each module at ``level`` with its subtree's parameters and cache and its own peaks; a
    shallower module (the model's own code, ``transformer``) keeps only what is its own and is
    shown only when it holds anything of its own."""
    deeper = {ancestor(str(r.get("module", "")), depth(str(r.get("module", ""))) - 1)
              for r in rows if depth(str(r.get("module", ""))) > 0}
    shown = []
    for name, row in fold(rows, level).items():
        if depth(name) < level and name in deeper:  # a parent: its own code's bytes only
            if not any(row[k] for k in SUMMED):
                continue
            row = dict(row, module=f"{name} (own)" if name else "(own)", **dict.fromkeys(PEAKS))
        shown.append(row)
    return shown


def groups(rows: list[dict[str, Any]], level: int) -> list[dict[str, Any]]:
    """The children of the numbered modules at ``level``, across the blocks
    (transformer.h.*.attn): parameters and cache summed, the largest peak, ``members``."""
    out: dict[str, dict[str, Any]] = {}
    for row in at_level(rows, level + 1):
        name = str(row.get("module", ""))
        if depth(name) != level + 1 or name.endswith("(own)"):
            continue
        key = pattern(name)
        if key == name or pattern(ancestor(name, level)) == ancestor(name, level):
            continue  # not under a numbered module
        g = out.setdefault(key, {"module": key, "members": 0, **dict.fromkeys(SUMMED, 0),
                                 **dict.fromkeys(PEAKS)})
        g["members"] += 1
        for k in SUMMED:
            g[k] += _int(row, k)
        for k in PEAKS:
            value = _peak(row, k)
            if value is not None and (g[k] is None or value > g[k]):
                g[k] = value
    return list(out.values())


def sorted_rows(rows: Iterable[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Largest first by ``key``; a peak not read sorts last."""
    return sorted(rows, key=lambda r: (-_int(r, key), str(r.get("module", ""))))


def largest(rows: list[dict[str, Any]], key: str) -> tuple[str, int] | None:
    """The submodule with the largest ``key`` and its value, the deepest among those within 5%
    of it (the one doing the work, not the container whose peak includes it); numbered
    siblings (the blocks) are named together: "transformer.h.* (4 alike)"."""
    inner = [r for r in rows if r.get("module")]
    best = max((_int(r, key) for r in inner), default=0)
    if best <= 0:
        return None
    ties = [r for r in inner if _int(r, key) >= best * 0.95]
    top = max(ties, key=lambda r: (depth(str(r["module"])), _int(r, key)))
    name = str(top["module"])
    alike = [r for r in inner if pattern(str(r["module"])) == pattern(name)]
    if len(alike) > 1:
        return f"{pattern(name)} ({len(alike)} alike)", max(_int(r, key) for r in alike)
    return name, _int(top, key)


def infer_attribution_hints(data: Mapping[str, Any]) -> list[str]:
    """What the window means, in the user's terms, from its measured figures only."""
    rows = rows_of(data)
    hints: list[str] = []
    kv = _int(data, "kv_cache_total_bytes")
    b, ctx, block = (_int(data, k) for k in ("batch_size", "context_tokens", "block_size"))
    if kv and b and ctx:
        holders = [r for r in rows if _int(r, "kv_cache_bytes")]
        per_token = kv / (b * ctx)
        where = (pattern(str(holders[0]["module"])) if holders else "no module")
        text = (f"the KV cache is {format_bytes(kv)} after {ctx} positions × B={b}, held by "
                f"{len(holders)} × {where}: {format_bytes(per_token)} per token per sequence")
        if block > ctx:
            text += (f"; at the block size ({block}) it would be "
                     f"{format_bytes(per_token * b * block)}")
        hints.append(text)
    pre = largest(rows, "prefill_peak_bytes")
    dec_step, pre_step = _int(data, "decode_step_peak_bytes"), _int(data, "prefill_step_peak_bytes")
    if pre is not None:
        name, pre_b = pre
        dec = largest(rows, "decode_peak_bytes")
        text = f"prefill's forward peaks highest in {name}: {format_bytes(pre_b)}"
        if dec is not None:
            text += f"; decode's in {dec[0]}: {format_bytes(dec[1])}"
        if data.get("attention") == "explicit" and name.endswith(".attn") and \
                _int(data, "prompt_len"):
            text += (f": explicit attention materialises B × heads × {_int(data, 'prompt_len')}² "
                     "scores in prefill; --attention sdpa does not")
        hints.append(text)
    if pre_step and dec_step and pre_step > dec_step:
        hints.append(f"prefill's forward rises {format_bytes(pre_step)} above its start, a "
                     f"decode step's {format_bytes(dec_step)}: beside the cache, admission must "
                     f"leave room for prefill's transient ({pre_step / dec_step:.0f}× decode's)")
    return hints


def infer_attribution_summary(d: Mapping[str, Any]) -> str:
    """"request 3: KV cache 1.0 MiB in 4 modules; prefill peak highest in transformer.h.*
    (4 alike): 1.8 MiB"."""
    rows = rows_of(d)
    holders = sum(1 for r in rows if _int(r, "kv_cache_bytes"))
    text = (f"request {d.get('request', '?')}: KV cache "
            f"{format_bytes(_int(d, 'kv_cache_total_bytes'))} in {holders} modules")
    pre = largest(rows, "prefill_peak_bytes")
    if pre is not None:
        text += f"; prefill peak highest in {pre[0]}: {format_bytes(pre[1])}"
    return text


__all__ = ["INFER_ATTRIBUTION_FIELDS", "INFER_ROW_FIELDS", "at_level", "blocks_level",
           "fold", "groups", "infer_attribution_hints", "infer_attribution_summary", "largest",
           "rows_of", "sorted_rows"]
