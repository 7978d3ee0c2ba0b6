"""One line: at the budget, how many concurrent sequences fit, and what limits them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from textual.widgets import Static

from tui.format_infer import admission_text


class AdmissionLine(Static):
    DEFAULT_CSS = """
    AdmissionLine { height: 1; width: 1fr; padding: 0 1; color: $text-accent; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id, markup=False)
        self.data: Mapping[str, Any] | None = None
        self._text = ""

    def show(self, data: Mapping[str, Any] | None) -> None:
        self.data = data
        self.refresh_view()

    def on_resize(self) -> None:
        self.refresh_view()

    @property
    def text(self) -> str:
        return self._text

    def refresh_view(self) -> None:
        width = max(1, self.content_region.width or self.size.width or 80)
        text = admission_text(self.data, width)
        if text != self._text:
            self._text = text
            self.update(text, layout=False)
