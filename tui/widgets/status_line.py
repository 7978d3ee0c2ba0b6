"""The status line: profiler phase, leak demo state, stop reason, dropped samples."""

from __future__ import annotations

from tui.widgets.text_line import TextLine


class StatusLine(TextLine):
    DEFAULT_CSS = """
    StatusLine {
        height: 1;
        width: 1fr;
        background: $boost;
        color: $text-muted;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)

    def show(self, text: str) -> None:
        self.set_text(text)

