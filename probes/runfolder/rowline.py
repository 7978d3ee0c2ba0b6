"""A training step row's JSON line from its values in one %-format call (issue 28).

``json.JSONEncoder`` on a step row's dict builds the dict (35 entries), encodes every key and
checks every value's type on each step: ~12 µs in vitro, of which the floats' shortest repr is
~5. Here the row is a template made once per *shape* of row — which fields are None, int or
float, and the few str and bool fields' values (amp, device, profiling, leak_active), which
rarely change in a run — with the keys, nulls, strings and booleans already written, and one
%-format per number: ``%d`` for an int and ``%r`` for a float, what the encoder writes
(int.__repr__, float.__repr__), but for the durations (``time_s`` and the ``*_ms`` fields),
written to 9 significant digits (``%.9g``: a nanosecond on a one-second step, finer than any
clock memtop reads; a float's shortest repr, 17 digits here, costs ~0.4 µs, ``%.9g`` ~0.1).
tests/unit/test_rowline.py checks on random rows that the line reads back as the encoder's
but for that rounding: ~6 µs in vitro, the other floats' repr being most of what is left.

Anything else falls back to the encoder (``training_line`` returns None): a value of another
type (numpy scalars, a bool where a number goes), a float that is not finite (the encoder's
json_safe path writes those as null), a literal the check for ``inf``/``nan`` could not tell
apart from a number.
"""

from __future__ import annotations

import dataclasses
import json
from itertools import compress
from operator import itemgetter
from typing import Any

from probes.records import STEP_FIELDS, StepSample

# the training fields written as literals in the template: str and bool in the schema
_LITERAL_FIELDS = tuple(f.name for f in dataclasses.fields(StepSample)
                        if f.name in STEP_FIELDS and str(f.type) in ("str", "bool"))
_LITERAL_AT = tuple(STEP_FIELDS.index(name) for name in _LITERAL_FIELDS)
_GET_LITERALS = itemgetter(*_LITERAL_AT)
_NUMBER_FORMATS = {int: "%d", float: "%r"}
DURATION_FIELDS = frozenset(name for name in STEP_FIELDS
                            if name == "time_s" or name.endswith("_ms"))
DURATION_FORMAT = "%.9g"  # significant digits a duration keeps in the file (the docstring)
MAX_SHAPES = 64  # templates kept; a run has a handful (None patterns, amp mode, profiling)

Template = tuple[str, tuple[bool, ...]]  # the %-format and which values it takes
_templates: dict[tuple[Any, ...], Template | None] = {}


def training_line(values: tuple[Any, ...]) -> str | None:
    """The JSON line (no newline) of a training row's values in STEP_FIELDS order (what
    ``StepSample.training_values`` gives), or None where only the encoder can write it."""
    key = (tuple(map(type, values)), _GET_LITERALS(values))
    try:
        template = _templates[key]
    except KeyError:
        template = _remember(key)
    if template is None:
        return None
    fmt, takes = template
    line = fmt % tuple(compress(values, takes))
    if "inf" in line or "nan" in line:  # a number that is not finite: no template says it
        return None
    return line


def _remember(key: tuple[Any, ...]) -> Template | None:
    if len(_templates) >= MAX_SHAPES:
        _templates.clear()
    template = _templates[key] = make_template(*key)
    return template


def make_template(types: tuple[type, ...], literals: tuple[Any, ...]) -> Template | None:
    """The %-format of one row shape, or None when a value's type has no template."""
    if len(types) != len(STEP_FIELDS):
        return None
    literal_of = dict(zip(_LITERAL_AT, literals, strict=True))
    parts: list[str] = []
    takes: list[bool] = []
    for index, (name, kind) in enumerate(zip(STEP_FIELDS, types, strict=True)):
        key = json.dumps(name)
        if index in literal_of:
            value = literal_of[index]
            if type(value) not in (str, bool):
                return None
            parts.append(f"{key}:{json.dumps(value).replace('%', '%%')}")
            takes.append(False)
        elif kind is type(None):
            parts.append(f"{key}:null")
            takes.append(False)
        elif kind is float and name in DURATION_FIELDS:
            parts.append(f"{key}:{DURATION_FORMAT}")
            takes.append(True)
        elif kind in _NUMBER_FORMATS:
            parts.append(f"{key}:{_NUMBER_FORMATS[kind]}")
            takes.append(True)
        else:
            return None
    fmt = "{" + ",".join(parts) + "}"
    if "inf" in fmt or "nan" in fmt:
        return None  # training_line's check would take the text for a number
    return fmt, tuple(takes)
