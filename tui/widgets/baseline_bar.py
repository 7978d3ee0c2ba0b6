"""One line under the panes: the run's headline figures against `--baseline RUN`'s."""

from __future__ import annotations

from textual.widgets import Static


class BaselineBar(Static):
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
        super().__init__("", id=id, markup=False)
        self._text = ""

    def show(self, text: str) -> None:
        if not self.has_class("-shown"):
            self.add_class("-shown")
        if text != self._text:
            self._text = text
            self.update(text, layout=False)

    @property
    def text(self) -> str:
        return self._text
