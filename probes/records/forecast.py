"""Time to full as one phrase (what fills what, at which rate, in how long), from the forecast
fields a leak or guard event carries (probes/counters/fill.py): the banner, headless and the
report say it the same way."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from probes.records.values import finite_num
from probes.tools.units import format_bytes, format_duration, format_steps

_SHORT = {"host RSS": "RSS", "host RAM available": "RAM", "--max-memory": "the limit",
          "device reserved": "reserved", "device used (driver)": "driver used",
          "device total": "device"}


def fill_text(d: Mapping[str, Any], short: bool = False) -> str | None:
    """Time to full as one phrase, from a leak or guard event's forecast fields
    (probes/counters/fill.py): what fills what, at which rate, in how long; None without one."""
    steps, secs = finite_num(d.get("steps_to_full")), finite_num(d.get("seconds_to_full"))
    if steps is None and secs is None:
        return None
    counter = d.get("fill_counter") or "memory"
    limit = d.get("limit_name") or "the limit"
    if steps == 0 or (steps is None and secs is not None and secs <= 0):
        when = "now"  # nothing left: "in ~0 steps / 0.00 s" read as a figure (user pass)
    elif secs is None:
        when = f"in ~{format_steps(steps)} steps"
    elif short or steps is None:
        when = f"in {format_duration(secs)}"
    else:
        when = f"in ~{format_steps(steps)} steps / {format_duration(secs)}"
    if short:  # one 80-column banner line
        return f"{_SHORT.get(counter, counter)} fills {_SHORT.get(limit, limit)} {when}"
    rate = finite_num(d.get("fill_bytes_per_step"))
    room = finite_num(d.get("capacity_bytes"))
    at = f" at +{format_bytes(rate)}/step" if rate is not None else ""
    of = f" ({format_bytes(room)} left)" if room is not None else ""
    return f"{counter} fills {limit}{of}{at} {when}"
