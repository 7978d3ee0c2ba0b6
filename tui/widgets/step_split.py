"""The step-split pane (issue 26): where the last step went (a stacked bar of data wait,
forward, backward, optimizer, other), each phase's last value, median over the recent steps and
share of the cycle, and how busy the GPU is (NVML's latest poll; n/a on CPU).

A phase that was never seen says why (probes/analysis/step_split.py); a run written before the
split existed says so. ``v`` cycles to it like the other lower views. The text is built by a
pure function (``step_split_lines``), tested without an App.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from probes.analysis.step_split import (
    PREDATES,
    WHY_NONE,
    phase_medians,
    row_split,
    shares,
)
from probes.records import SPLIT_FIELDS, SPLIT_LABELS, StepSample
from probes.tools.units import NA, format_ms, format_pct, format_reading
from tui.format import fit
from tui.widgets.text_line import TextLine

RECENT_STEPS = 20  # the medians' window
BAR_CHARS = {"data_wait_ms": "░", "forward_ms": "█", "backward_ms": "▓", "optimizer_ms": "▒",
             "other_ms": "·"}  # one fill per phase; the table's first column is its legend
SPLIT_OFF = "the step split was off for this run (Monitor(step_split=False))"


def stacked_bar(split: Mapping[str, float | None], width: int) -> str:
    """The phases seen as runs of their fill characters, ``width`` cells long in all
    (largest-remainder rounding: the cells always add up)."""
    seen = {k: v for k, v in split.items() if v is not None and v > 0}
    total = sum(seen.values())
    if not seen or width <= 0 or total <= 0:
        return ""
    exact = {k: v / total * width for k, v in seen.items()}
    cells = {k: int(x) for k, x in exact.items()}
    for k in sorted(exact, key=lambda k: exact[k] - cells[k], reverse=True)[
            :width - sum(cells.values())]:
        cells[k] += 1
    return "".join(BAR_CHARS[k] * cells[k] for k in SPLIT_FIELDS if k in cells)


def gpu_busy_text(sample: StepSample | None, device_type: str) -> str:
    """The NVML figures recorded with the step (CUDA), or why there are none."""
    if device_type != "cuda":
        return "GPU busy: n/a on CPU"
    s = sample
    if s is None:
        return "GPU busy: waiting for the first step"
    power = (f"{format_reading(s.power_w, 'W')} / {format_reading(s.power_limit_w, 'W')}"
             if s.power_limit_w is not None else format_reading(s.power_w, "W"))
    note = "  (MIG slice: no utilisation)" if s.gpu_util_pct is None and s.power_w is not None \
        else ""
    return (f"GPU busy {format_reading(s.gpu_util_pct, '%')}  mem bw "
            f"{format_reading(s.mem_bw_util_pct, '%')}  power {power}  SM "
            f"{format_reading(s.sm_clock_mhz, 'MHz')}  {format_reading(s.temperature_c, '°C')}"
            + note)


def step_split_lines(recent: Sequence[StepSample], device_type: str,
                     started: Mapping[str, Any], width: int, height: int) -> list[str]:
    """The pane's lines, fitting ``width`` × ``height``: the bar, a row per phase (last,
    median, share of the median cycle), the GPU line, then why a phase is missing."""
    width = max(width, 20)
    if started.get("step_split") is False:
        return [fit(SPLIT_OFF, width), fit(gpu_busy_text(recent[-1] if recent else None,
                                                         device_type), width)][:height]
    if not recent:
        return [fit("step split: waiting for the first step…", width)]
    if "step_split" not in started and all(
            v is None for s in recent for v in row_split(s).values()):
        return [fit(f"n/a: {PREDATES}", width), fit(gpu_busy_text(recent[-1], device_type),
                                                    width)][:height]
    last = recent[-1]
    split = row_split(last)
    medians = phase_medians(recent)
    share = shares(medians)
    clock = "device time" if device_type == "cuda" else "host time"
    measured = "" if last.split_step in (None, last.step) else f" (measured step {last.split_step})"
    lines = [fit(f"step {last.step}{measured}, {clock}", width),
             fit(stacked_bar(split, width - 2) or "no phase seen this step", width),
             fit(f"  {'phase':<11}{'last':>10}{'median':>10}{'share':>8}", width)]
    for name in SPLIT_FIELDS:
        lines.append(fit(f"{BAR_CHARS[name]} {SPLIT_LABELS[name]:<11}"
                         f"{format_ms(split[name]):>10}{format_ms(medians[name]):>10}"
                         f"{format_pct(share[name], NA):>8}", width))
    lines.append(fit(gpu_busy_text(last, device_type), width))
    for name in SPLIT_FIELDS:
        if medians[name] is None:
            lines.append(fit(f"{SPLIT_LABELS[name]}: {WHY_NONE[name]}", width))
    return lines[:max(height, 1)]


class StepSplitPane(TextLine):
    """Fed the (rank 0) samples by the app; redrawn on its timer when changed."""

    DEFAULT_CSS = """
    StepSplitPane {
        width: 1fr;
        height: 1fr;
        padding: 0 1;
        border: round $primary-background-lighten-2;
    }
    """  # shown only in the "split" view: tui/memtop.tcss, beside the rank table's rules

    def __init__(self, device_type: str = "cpu", *, id: str | None = None) -> None:
        super().__init__("step split: waiting for the first step…", id=id)
        self.device_type = device_type
        self.recent: deque[StepSample] = deque(maxlen=RECENT_STEPS)
        self.started: Mapping[str, Any] = {}
        self._dirty = False

    def on_mount(self) -> None:
        self.border_title = f"where the step went (median of the last {RECENT_STEPS})"

    def push(self, samples: Sequence[StepSample], started: Mapping[str, Any] | None,
             device_type: str) -> None:
        self.recent.extend(samples)
        self.started = started or {}
        self.device_type = device_type
        self._dirty = True

    def refresh_view(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        width = self.content_size.width or 78
        height = max(3, self.content_size.height or 10)
        self.set_text("\n".join(step_split_lines(list(self.recent), self.device_type,
                                                 self.started, width, height)))
