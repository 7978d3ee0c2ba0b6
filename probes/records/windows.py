"""How a profiler window is named wherever it is shown: by the steps its table sums.

A window opens at step N (its folder is profiles/step-N[/rank-K], a name kept so every run
folder still opens), waits and warms up, traces its active steps, and its table is ready a few
steps later (profile_done's own step). Three step numbers for one window read as two windows
("top ops · step 55" above "profiles/step-50", issue 44): the dashboard, a viewer, the headless
line and the report all name it by its active steps ("steps 52–54"), and the folder's number
is said as where the window opened.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def window_steps(done: Mapping[str, Any], started: Mapping[str, Any] | None = None) \
        -> tuple[int, int] | None:
    """(first, last) active step of a window: profile_done's ``steps``, else what its
    profile_started row planned (its step + wait + warmup, ``active`` steps); None when
    neither says (an old run's row)."""
    steps = done.get("steps")
    if isinstance(steps, list) and steps and all(isinstance(s, int) for s in steps):
        return min(steps), max(steps)
    if started is None:
        return None
    first, wait, warmup, active = (started.get(k) for k in ("step", "wait", "warmup", "active"))
    if not all(isinstance(v, int) and not isinstance(v, bool)
               for v in (first, wait, warmup, active)) or active < 1:
        return None
    return first + wait + warmup, first + wait + warmup + active - 1


def window_name(span: tuple[int, int] | None, ready_step: object = None) -> str:
    """'steps 52–54' ('step 52' for one); without its steps, where its table came."""
    if span is None:
        return f"ready at step {ready_step}" if ready_step is not None else "window"
    first, last = span
    return f"step {first}" if first == last else f"steps {first}–{last}"


def window_opened(done: Mapping[str, Any]) -> int | None:
    """The step the window opened at (its folder's profiles/step-N): profile_done's
    ``first_step``, else read from its ``dir``; None when neither says."""
    first = done.get("first_step")
    if isinstance(first, int) and not isinstance(first, bool):
        return first
    for part in str(done.get("dir") or "").split("/"):
        if part.startswith("step-") and part[5:].isdigit():
            return int(part[5:])
    return None
