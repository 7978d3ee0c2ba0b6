"""Which steps memtop's own diagnosis disturbed, and why: the one rule every figure follows
(issues 38 and 44). A disturbed step is left out of step timing (medians, p95, the dashboard's
step-time range), of the peaks and of the leak detector, live and read back alike.

A step is disturbed when
- the profiler traced it (``traced``: a window's wait, warmup and active steps, the row's
  ``profiling``): the profiler's hooks slow it and its buffers fill the heap;
- a window's top-ops table was being computed while it ran (``analysis``: from the step of
  ``profile_analysing`` to the step of its ``profile_done``/``profile_cancelled``; the child
  process that computes it shares the cores, so a step then ran 4-18x longer on two cores);
- it is one of the ``SETTLE_STEPS`` steps after a window ended (``settle``: the profiler's
  buffers are freed into those steps' heap readings, the child's start-up and exit);
- the culprit finder was looking (``look``: from its first census, ``leak_look``, to its
  second, ``leak_culprit``; tracemalloc runs between them and grows the heap), or it is the step
  after the second census (``after_look``: the census and the referrer walk are freed then);
- a memory attribution window ran it (``attributed``: from its ``attribution_started`` step to
  its ``memory_attribution``, ``infer_attribution`` or ``attribution_cancelled``; per-module
  hooks slow its forward and their bookkeeping sits on the heap), or it is the step after
  (``after_attribution``: the hooks' records are freed into it).
  probes/instruments/attribution.py.

Two ways to the same answer: live, ``DisturbedSteps`` is fed every event as it is published
(probes/runfolder/state.py's fold) and names each step as its row is built (the row's
``disturbed`` field, probes/monitor/session.py); read back, ``mark_disturbed`` replays a
metrics file's rows in file order, so a folder written before rows carried the field (or
before ``leak_look`` existed: a look's steps are then those ``leak_culprit`` names) reads
the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from probes.records.events import (
    ATTRIBUTION_CANCELLED,
    ATTRIBUTION_STARTED,
    INFER_ATTRIBUTION,
    LEAK_CULPRIT,
    LEAK_LOOK,
    MEMORY_ATTRIBUTION,
    PROFILE_ANALYSING,
    PROFILE_CANCELLED,
    PROFILE_DONE,
    PROFILE_STARTED,
)
from probes.records.step import StepSample
from probes.records.values import is_int

TRACED = "traced"
ANALYSIS = "analysis"
SETTLE = "settle"
LOOK = "look"
AFTER_LOOK = "after_look"
ATTRIBUTED = "attributed"
AFTER_ATTRIBUTION = "after_attribution"
REASONS = {  # the row's value -> what it means, for the report and the help
    TRACED: "traced by the profiler",
    ANALYSIS: "run while a profiler window's table was computed",
    SETTLE: "just after a profiler window",
    LOOK: "inside a culprit look",
    AFTER_LOOK: "just after a culprit look",
    ATTRIBUTED: "inside a memory attribution window",
    AFTER_ATTRIBUTION: "just after a memory attribution window",
}
SETTLE_STEPS = 3  # steps after a window's end whose heap and time still carry it

PEAK_RULE = ("peaks leave out the steps memtop's own diagnosis disturbed (a profiler window's "
             "traced steps, the steps while its table was computed and the 3 after it, a "
             "culprit look's steps and the one after, a memory attribution window's steps and "
             "the one after), as step timing and the leak detector do: tracing's own buffers "
             "are not the model's memory")


def disturbed_reason(row: StepSample | Mapping[str, Any]) -> str | None:
    """Why a step row (a sample, or a row read back and marked) is disturbed; None when not.
    A row without the field (an old folder not marked) still says whether it was traced."""
    if isinstance(row, StepSample):
        reason, traced = row.disturbed, row.profiling
    else:
        reason, traced = row.get("disturbed"), row.get("profiling")
    if isinstance(reason, str) and reason:
        return reason
    return TRACED if traced else None


def is_disturbed(row: StepSample | Mapping[str, Any]) -> bool:
    return disturbed_reason(row) is not None


def counts_toward_peak(row: StepSample | Mapping[str, Any]) -> bool:
    """One rule for every peak memtop shows (the pane, headless, the report): a disturbed step
    does not count (``PEAK_RULE``)."""
    return disturbed_reason(row) is None


class DisturbedSteps:
    """The rule, fed events in the order they were published; ``reason(step, traced)`` names a
    step whose row is built after every event published before it. Cheap: a few comparisons
    per step (the step path's budget, issue 28)."""

    def __init__(self, settle_steps: int = SETTLE_STEPS) -> None:
        self.settle_steps = settle_steps
        self._open = 0  # windows started and not yet analysing or ended
        self._analysing: dict[Any, int] = {}  # a window's dir -> its profile_analysing step
        self._settle_until = 0  # steps up to this one settle after a window
        self._look_since: int | None = None  # the first look's step, while a look is open
        self._after_look = -1  # the step after the last look's second census
        self._attr_since: int | None = None  # an attribution window's first step, while open
        self._attr_span = (0, -1)  # the last closed window's first and last step

    def event(self, kind: str, step: Any, data: Mapping[str, Any]) -> None:
        """Fold one event (its kind, step and fields)."""
        if not is_int(step):
            return
        if kind == PROFILE_STARTED:
            self._open += 1
        elif kind == PROFILE_ANALYSING:
            self._open = max(0, self._open - 1)
            self._analysing[data.get("dir")] = step
            self._settle(step)
        elif kind in (PROFILE_DONE, PROFILE_CANCELLED):
            if data.get("dir") in self._analysing:
                self._analysing.pop(data.get("dir"))
            elif self._open:  # a window cancelled while it traced, or its export failed
                self._open -= 1
            elif kind == PROFILE_CANCELLED and not self._analysing:
                return  # a window that never started (or was never due): nothing to settle
            self._settle(step)
        elif kind == LEAK_LOOK:
            self._look_since = step
        elif kind == LEAK_CULPRIT and self._look_since is not None:  # (the workers' answer
            self._look_since = None  # comes without a look: nothing of the trainer's moved)
            self._after_look = step + 1
        elif kind == ATTRIBUTION_STARTED:
            self._attr_since = step
        elif kind in (MEMORY_ATTRIBUTION, INFER_ATTRIBUTION, ATTRIBUTION_CANCELLED):
            # its last step is the event's: a window cancelled mid-step names that step
            if self._attr_since is not None:
                self._attr_span = (self._attr_since, step)
            elif kind in (MEMORY_ATTRIBUTION, INFER_ATTRIBUTION):  # a folder cut before its start
                self._attr_span = (step, step)
            self._attr_since = None

    def _settle(self, step: int) -> None:
        self._settle_until = max(self._settle_until, step + self.settle_steps)

    def reason(self, step: int, traced: bool = False) -> str | None:
        """Why ``step`` is disturbed, or None."""
        if traced:
            return TRACED
        if self._attr_since is not None and step >= self._attr_since:
            return ATTRIBUTED
        first, last = self._attr_span
        if first <= step <= last:
            return ATTRIBUTED
        if self._analysing and any(step > since for since in self._analysing.values()):
            return ANALYSIS
        if self._look_since is not None and step > self._look_since:
            return LOOK
        if step == self._after_look:
            return AFTER_LOOK
        if step == last + 1 and last >= 0:
            return AFTER_ATTRIBUTION
        if step <= self._settle_until:
            return SETTLE
        return None


def mark_disturbed(rows: Iterable[dict[str, Any]]) -> None:
    """Set ``disturbed`` on every step row of one metrics file (rows in file order, events
    among them) that does not carry it: an old folder read with today's rule. A row that
    carries it (written by a session that knew) keeps it."""
    rows = list(rows)
    if all("event" in r or "disturbed" in r for r in rows):
        return
    # a folder without leak_look: each look's steps from its leak_culprit (first_step, step)
    has_look_start = any(r.get("event") == LEAK_LOOK for r in rows)
    looks = [] if has_look_start else [
        (r["first_step"], r["step"]) for r in rows
        if r.get("event") == LEAK_CULPRIT and is_int(r.get("first_step")) and is_int(r.get("step"))]
    rule = DisturbedSteps()
    for row in rows:
        if "event" in row:
            rule.event(row["event"], row.get("step"), row)
            continue
        if "disturbed" in row:
            continue
        step = row["step"]
        reason = rule.reason(step, bool(row.get("profiling")))
        if reason is None or reason == SETTLE:
            for first, last in looks:
                if first < step <= last:
                    reason = LOOK
                elif step == last + 1 and reason is None:
                    reason = AFTER_LOOK
        row["disturbed"] = reason


def disturbed_counts(rows: Iterable[StepSample | Mapping[str, Any]]) -> dict[str, int]:
    """How many rows each reason left out, for a sentence that says what was left out."""
    out: dict[str, int] = {}
    for row in rows:
        reason = disturbed_reason(row)
        if reason is not None:
            out[reason] = out.get(reason, 0) + 1
    return out


def left_out_text(counts: Mapping[str, int]) -> str:
    """"3 traced by the profiler, 2 inside a culprit look": the counts in words."""
    return ", ".join(f"{n} {REASONS.get(reason, reason)}" for reason, n in counts.items())


__all__ = ["AFTER_ATTRIBUTION", "AFTER_LOOK", "ANALYSIS", "ATTRIBUTED", "LOOK", "PEAK_RULE",
           "REASONS", "SETTLE", "SETTLE_STEPS",
           "TRACED", "DisturbedSteps", "counts_toward_peak", "disturbed_counts",
           "disturbed_reason", "is_disturbed", "left_out_text", "mark_disturbed"]
