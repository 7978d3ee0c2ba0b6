"""Shown when the training fails: the dashboard stays up with the last samples and the error."""

from __future__ import annotations

from tui.widgets.text_line import TextLine


class ErrorBanner(TextLine):
    RELAYOUT = True  # its height follows the text
    DEFAULT_CSS = """
    ErrorBanner {
        display: none;
        height: auto;
        max-height: 4;
        width: 1fr;
        padding: 0 1;
        background: $error-darken-2;
        color: $text;
        text-style: bold;
    }
    ErrorBanner.-shown { display: block; }
    ErrorBanner.-warning { background: $warning-darken-3; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)

    def show_message(self, text: str, warning: bool = False) -> None:
        self.set_class(warning, "-warning")
        self.set_class(True, "-shown")
        self.set_text(text)

    @property
    def shown(self) -> bool:
        return self.has_class("-shown")
