"""The status line: profiler phase, leak demo state, stop reason, dropped samples."""

from __future__ import annotations

from textual.widgets import Static


class StatusLine(Static):
    DEFAULT_CSS = """
    StatusLine {
        height: 1;
        width: 1fr;
        background: $boost;
        color: $text-muted;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id, markup=False)
        self._text = ""

    def show(self, text: str) -> None:
        if text != self._text:
            self._text = text
            self.update(text, layout=False)

    @property
    def text(self) -> str:
        return self._text
