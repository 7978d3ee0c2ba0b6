"""What holds the memory: the culprit finder's answer (a ``leak_culprit`` event), under the
leak banner. Hidden until the first answer; the next answer replaces it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from probes.records.culprits import culprit_line, culprit_summary
from tui.widgets.text_line import TextLine

MAX_LINES = 4  # culprits shown; the report lists them all


def culprit_box_text(step: int, data: Mapping[str, Any]) -> str:
    """The box's text: a title line with when and how long the look took, then a line per
    culprit (or the reason nothing was named)."""
    look = data.get("look_s")
    took = f", look {look:.2f} s" if isinstance(look, (int, float)) else ""
    steps = data.get("steps")
    over = f" over {steps} steps" if isinstance(steps, int) else ""
    title = f"WHO HOLDS MEMORY (step {step}{over}{took}; w looks again)"
    culprits = [c for c in data.get("culprits") or [] if isinstance(c, Mapping)]
    if data.get("error") or not culprits:
        return f"{title}\n{culprit_summary(data)}"
    lines = [culprit_line(c) for c in culprits[:MAX_LINES]]
    if len(culprits) > MAX_LINES:
        lines.append(f"... {len(culprits) - MAX_LINES} more in the report")
    return "\n".join([title, *lines])


class CulpritBox(TextLine):
    """Hidden until the finder answers; then its lines, a warning colour while they name one."""

    RELAYOUT = True  # its height follows the text

    DEFAULT_CSS = """
    CulpritBox {
        display: none;
        height: auto;
        max-height: 6;
        width: 1fr;
        padding: 0 1;
        background: $warning-darken-3;
        color: $text;
    }
    CulpritBox.-shown { display: block; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.data: dict[str, Any] | None = None

    def show_culprits(self, step: int, data: Mapping[str, Any]) -> None:
        self.data = dict(data)
        self.set_text(culprit_box_text(step, data))
        self.set_class(True, "-shown")

    def leak_over(self) -> None:
        """Every leak alert has cleared: the box goes (its answer named what held memory then;
        the report keeps it, and `w` looks again)."""
        self.set_class(False, "-shown")

    def looking(self) -> None:
        """The `w` key was pressed: say so until the answer comes."""
        self.set_text("WHO HOLDS MEMORY: looking now and again in a few steps ...")
        self.set_class(True, "-shown")
