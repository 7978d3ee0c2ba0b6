"""The DataLoader workers' records: the ``workers`` and ``worker_died`` events' fields and
lines, and a workers' leak alert in words (events.py declares the kinds; the sampler is
probes/counters/workers.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from probes.records.values import finite_num, is_int
from probes.tools.units import format_bytes

WORKERS_COUNTER = "workers_private"  # the leak watch's series of the workers' summed USS
CHILD_FIELDS: dict[str, Any] = {
    "pid": "int", "comm": "str", "rss_bytes": "int", "pss_bytes": "int", "uss_bytes": "int",
    "peak_uss_bytes": "int", "lived_s": "num", "exit": "str", "why": "str"}
WORKERS_FIELDS: dict[str, Any] = {
    "workers": "int", "started": [CHILD_FIELDS], "ended": [CHILD_FIELDS],
    "left_out": [CHILD_FIELDS], "workers_pss_bytes": "int", "workers_uss_bytes": "int"}


def workers_leak_text(d: Mapping[str, Any]) -> str:
    """A workers' leak in one clause: "DataLoader workers: +4 MiB/step between 2 workers, the
    trainer flat" (the event's line, the banner, the report)."""
    n = d.get("workers")
    between = f" between {n} worker{'s' if n != 1 else ''}" if is_int(n) else ""
    text = f"DataLoader workers: +{format_bytes(d.get('bytes_per_step'))}/step{between}"
    if d.get("trainer_flat") is True:
        text += ", the trainer flat"
    elif finite_num(d.get("trainer_bytes_per_step")) is not None:
        text += f", the trainer +{format_bytes(d['trainer_bytes_per_step'])}/step too"
    return text


def _child(c: Mapping[str, Any]) -> str:
    return f"{c.get('comm') or '?'} {c.get('pid')}"


def workers_summary(d: Mapping[str, Any]) -> str:
    """Which children started, ended (how, and what they held) or were left out."""
    parts = []
    started = [c for c in d.get("started") or [] if isinstance(c, Mapping)]
    if started:
        parts.append("started " + ", ".join(
            f"{_child(c)} (PSS {format_bytes(c.get('pss_bytes'))})" for c in started))
    for c in (c for c in d.get("ended") or [] if isinstance(c, Mapping)):
        lived = finite_num(c.get("lived_s"))
        parts.append(f"ended {_child(c)}"
                     + (f" after {lived:.1f} s" if lived is not None else "")
                     + (f", {c['exit']}" if c.get("exit") else "")
                     + f", USS {format_bytes(c.get('uss_bytes'))} (peak "
                       f"{format_bytes(c.get('peak_uss_bytes'))})")
    for c in (c for c in d.get("left_out") or [] if isinstance(c, Mapping)):
        parts.append(f"left out {_child(c)}: {c.get('why') or '?'}")
    now = d.get("workers")
    return "; ".join(parts) + (f"; {now} counted now" if is_int(now) else "")


def worker_died_summary(d: Mapping[str, Any]) -> str:
    return (f"worker {_child(d)} {d.get('exit')} after {finite_num(d.get('lived_s')) or 0:.1f} "
            f"s, holding USS {format_bytes(d.get('uss_bytes'))}")
