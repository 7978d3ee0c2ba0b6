"""Reading a run folder for the report: config.json checked, metrics.jsonl split into rows.

Kept apart from building the report so that every value the report reads has one place where
its type is checked: a hand-edited or foreign metrics.jsonl gives n/a in the report, not a crash.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

LEAK_EVENTS = ("leak_suspected", "leak_cleared", "leak_demo_started", "leak_demo_stopped",
               "memory_guard")


class ReportError(ValueError):
    """The folder is not a readable run (missing, no metrics, junk, bad config): exit 2."""


GPT_SHAPE_KEYS = ("batch_size", "seq_len", "layers", "heads", "dim")


def is_gpt_config(config: dict[str, Any]) -> bool:
    """A run of memtop's own GPT (its shape is in config.json), not a user's own model: a
    Monitor names the model it watched, and a user's config may well hold a seq_len."""
    mon = config.get("monitor")
    if isinstance(mon, dict) and mon.get("model") not in (None, "GPT"):
        return False
    return all(key in config for key in ("layers", "heads", "dim"))


def read_config(run_dir: Path) -> dict[str, Any]:
    """config.json as a dict whose shape fields are positive integers, or ReportError."""
    path = run_dir / "config.json"
    if not path.is_file():
        raise ReportError(f"{run_dir} has no config.json: not a memtop run folder")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportError(f"{path} is not valid JSON ({type(exc).__name__})") from None
    if not isinstance(config, dict):
        raise ReportError(f"{path} is not a JSON object")
    # memtop's GPT records its shape (an inference run its own); a user's own loop
    # (probes.Monitor) records what it likes, and the report says "measured only" where a
    # formula would need the shape.
    if config.get("mode") == "infer":
        shape: tuple[str, ...] = ("batch_size", "prompt_len", "new_tokens", "requests",
                                  "layers", "heads", "dim")
    else:
        shape = GPT_SHAPE_KEYS if is_gpt_config(config) else ()
    for key in shape:
        value = config.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ReportError(f"{path}: {key} is {value!r}, not a positive integer")
    warmup = config.get("warmup_steps", 0)
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
        raise ReportError(f"{path}: warmup_steps is {warmup!r}, not a non-negative integer")
    return config


def read_rows(path: Path) -> dict[str, Any]:
    """Step rows, event rows, unreadable-line count, and whether the last line was cut short."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ReportError(f"cannot read {path}: {exc.strerror or exc}") from None
    lines = raw.decode("utf-8", errors="replace").split("\n")
    steps: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    bad = 0
    last_bad = False
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: thousands of nested brackets
            row = None
        ok = True
        if isinstance(row, dict) and isinstance(row.get("event"), str):
            events.append(clean_event(row))
        elif isinstance(row, dict) and "event" not in row and is_int(row.get("step")):
            steps.append(row)
        else:
            bad += 1
            ok = False
        last_bad = not ok
    truncated = bool(raw) and (last_bad or not raw.endswith(b"\n"))
    return {"steps": steps, "events": events, "bad": bad, "truncated": truncated}


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# The event fields the report reads, with the type it needs. A value of another type is dropped
# (the report shows n/a), so a hand-edited or foreign metrics.jsonl never crashes the rendering.
# A dict spec means "a dict, cleaned with this spec"; a one-dict list, "a list of such dicts".
_LEAK_FIELDS: dict[str, Any] = {
    "counter": "str", "kind": "str", "bytes_per_step": "num", "growth_bytes_per_step": "num",
    "since_step": "int", "seconds_to_full": "num", "steps_to_full": "num",
    "capacity_bytes": "int", "hint": "str"}
_OP_FIELDS = {"name": "str", "calls": "int", "self_cpu_us": "num", "cpu_total_us": "num",
              "self_device_us": "num", "device_total_us": "num", "cpu_memory_bytes": "int",
              "device_memory_bytes": "int"}
_SOFTWARE = ("python", "torch", "cuda", "cudnn", "numpy", "memtop", "os", "source")
EVENT_FIELDS: dict[str, dict[str, Any]] = {
    "run_started": {
        "device": "str", "device_name": "str", "device_total_bytes": "int", "amp": "str",
        "params": "int", "counters": "str", "driver_counter": "str",
        "system": {"gpu_name": "str", "gpu_capability": "scalar", "cpu_model": "str",
                   "cpu_count": "int", "ram_bytes": "int",
                   **{k: "scalar" for k in _SOFTWARE}}},
    "run_finished": {"reason": "str"},
    "error": {"error_type": "str", "message": "str"},
    "ledger": {
        "lines": [{"name": "str", "measured_bytes": "int", "predicted_bytes": "int",
                   "formula": "str", "note": "str"}],
        "model": {"vocab_size": "int", "param_dtype": "str"},
        "sampled_step": "int", "batch_size": "int", "seq_len": "int", "snapshot": "str",
        "measure_ms": "num", "total_measured_bytes": "int", "allocated_bytes": "int",
        "reserved_bytes": "int", "explained_bytes": "int", "unexplained_bytes": "int",
        "unexplained_ratio": "num", "attention_scores_bytes": "int",
        "peak_allocated_bytes": "int", "counter": "str", "device": "str"},
    "profile_done": {"dir": "str", "sort_by": "str", "analysis_s": "num",
                     "top_ops": [_OP_FIELDS]},
    "profile_cancelled": {"dir": "str", "reason": "str"},
    **{name: _LEAK_FIELDS for name in LEAK_EVENTS},
}


def _has_type(value: Any, kind: Any) -> bool:
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
    return isinstance(value, (str, int, float))  # "scalar": shown as text


def _clean(data: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        kind = spec.get(key)
        if kind is None or value is None:
            out[key] = value  # not read by the report, or n/a: kept as recorded
        elif not _has_type(value, kind):
            continue
        elif isinstance(kind, dict):
            out[key] = _clean(value, kind)
        elif isinstance(kind, list):
            out[key] = [_clean(x, kind[0]) for x in value if isinstance(x, dict)]
        else:
            out[key] = value
    return out


def clean_event(row: dict[str, Any]) -> dict[str, Any]:
    """The event with every field the report reads of the right type (others dropped)."""
    spec = EVENT_FIELDS.get(row["event"], {})
    return _clean(row, {"step": "int", **spec})


def finite_num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None
