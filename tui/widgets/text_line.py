"""The base of memtop's one-line and few-line text widgets: redraw only when the text changed.

A refresh at 2 Hz sets every bar's text whether or not it changed; passing an unchanged text to
``Static.update`` would still re-render it, and a changed one on a fixed-size widget needs no
relayout (docs/ARCHITECTURE.md, "Measured facts"). Widgets whose size follows their text (the
banners) ask for the relayout.
"""

from __future__ import annotations

from textual.widgets import Static


class TextLine(Static):
    """A Static whose ``text`` is what it shows; ``set_text`` redraws only on a change."""

    RELAYOUT = False  # True for widgets whose height follows the text

    def __init__(self, text: str = "", *, id: str | None = None) -> None:
        super().__init__(text, id=id, markup=False)
        self._text = ""

    def set_text(self, text: str) -> None:
        if text != self._text:
            self._text = text
            self.update(text, layout=self.RELAYOUT)

    @property
    def text(self) -> str:
        return self._text
