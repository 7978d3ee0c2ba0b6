"""One line: at the budget, how many concurrent sequences fit, and what limits them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tui.format_infer import admission_text
from tui.widgets.text_line import TextLine


class AdmissionLine(TextLine):
    DEFAULT_CSS = """
    AdmissionLine { height: 1; width: 1fr; padding: 0 1; color: $text-accent; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.data: Mapping[str, Any] | None = None

    def show(self, data: Mapping[str, Any] | None) -> None:
        self.data = data
        self.refresh_view()

    def on_resize(self) -> None:
        self.refresh_view()

    def refresh_view(self) -> None:
        width = max(1, self.content_region.width or self.size.width or 80)
        self.set_text(admission_text(self.data, width))
