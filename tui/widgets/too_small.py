"""Shown while the terminal is smaller than the layout needs (80×24): the run goes on.

Below 80×24 panes overlap or vanish without a word, which reads as memtop losing data. The
notice says the size it has, the size it needs and that training continues, on top of whatever
still fits; it goes away as soon as the terminal is large enough again.
"""

from __future__ import annotations

from tui.widgets.text_line import TextLine

MIN_COLUMNS, MIN_ROWS = 80, 24  # the smallest terminal every pane is laid out for


def too_small_text(columns: int, rows: int) -> str | None:
    """The notice for a terminal of ``columns``×``rows``, or None where the layout fits."""
    if columns >= MIN_COLUMNS and rows >= MIN_ROWS:
        return None
    return (f"terminal too small ({columns}×{rows}, need {MIN_COLUMNS}×{MIN_ROWS}): the run "
            "goes on and every step is recorded; enlarge the window (q quits)")


class TooSmallNotice(TextLine):
    RELAYOUT = True  # its height follows the text (it wraps on a narrow terminal)
    DEFAULT_CSS = """
    TooSmallNotice {
        display: none;
        height: auto;
        width: 1fr;
        padding: 0 1;
        background: $warning-darken-2;
        color: $text;
        text-style: bold;
    }
    TooSmallNotice.-shown { display: block; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)

    def show_size(self, columns: int, rows: int) -> None:
        text = too_small_text(columns, rows)
        self.set_class(text is not None, "-shown")
        if text is not None:
            self.set_text(text)

    @property
    def shown(self) -> bool:
        return self.has_class("-shown")
