"""Checking values read back from a run folder: one rule per type, so a hand-edited or
foreign metrics.jsonl reads as n/a instead of crashing a reader."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def finite_num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def has_type(value: Any, kind: Any) -> bool:
    if value is None:
        return True  # n/a is always allowed
    if isinstance(kind, dict):
        return isinstance(value, dict)
    if isinstance(kind, list):
        return isinstance(value, list)
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return is_int(value)
    if kind == "num":
        return finite_num(value) is not None
    if kind == "bool":
        return isinstance(value, bool)
    return isinstance(value, (str, int, float))  # "scalar": shown as text


def clean(data: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with every field named in ``spec`` of its declared type; others dropped.

    A dict spec means "a dict, cleaned with this spec"; a one-dict list, "a list of such dicts";
    a list of one type name, "a list of such values" (others dropped).
    Fields the spec does not name are kept as recorded.
    """
    out: dict[str, Any] = {}
    for key, value in data.items():
        kind = {"step": "int", "time_s": "num", "rank": "int"}.get(key, spec.get(key))
        if kind is None or value is None:
            out[key] = value
        elif not has_type(value, kind):
            continue
        elif isinstance(kind, dict):
            out[key] = clean(value, kind)
        elif isinstance(kind, list) and not isinstance(kind[0], dict):  # ["int"]: plain values
            out[key] = [x for x in value if x is not None and has_type(x, kind[0])]
        elif isinstance(kind, list):
            out[key] = [clean(x, kind[0]) for x in value if isinstance(x, dict)]
        else:
            out[key] = value
    return out


def short_text(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)

