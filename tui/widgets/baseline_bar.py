"""One line under the panes: the run's headline figures against `--baseline RUN`'s."""

from __future__ import annotations

from tui.widgets.text_line import TextLine


class BaselineBar(TextLine):
    """Hidden unless the run names a baseline; redrawn only when its text changes."""

    DEFAULT_CSS = """
    BaselineBar {
        height: 1;
        width: 1fr;
        padding: 0 1;
        display: none;
    }
    BaselineBar.-shown { display: block; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)

    def show(self, text: str) -> None:
        if not self.has_class("-shown"):
            self.add_class("-shown")
        self.set_text(text)

