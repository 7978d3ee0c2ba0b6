"""Textual's Footer without the per-screen-change leak (Textual issue #6666).

Footer.compose data_binds every FooterKey to Footer.compact; the watcher entries of the keys a
recompose removes stay on the Footer for good, so every screen change (help open/close) kept ~9
FooterKeys with their render caches alive: RSS grew ~2 MiB per minute of help presses and every
later gen-2 gc pass on the UI thread walked them (benchmarks/RESULTS.md, ui_latency A/B).

Its keys fit the row: where the full words do not, shorter ones, then descriptions cut with
"…" (tui/format.py footer_descriptions); Textual's footer cut the last key mid-word ("q q").
"""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from tui.format import footer_descriptions


class MemtopFooter(Footer):
    DEFAULT_CSS = """
    MemtopFooter { dock: bottom; }
    """

    def compose(self) -> ComposeResult:
        """Drop the watcher entries of keys no longer attached, then compose as Footer does."""
        watchers = getattr(self, "__watchers", {}).get("compact")
        if watchers:
            watchers[:] = [(r, cb) for r, cb in watchers if getattr(r, "is_attached", True)]
        items = list(super().compose())
        keys = [w for w in items if isinstance(w, FooterKey)]
        self._full = [(k.key_display, k.description) for k in keys]
        for key, text in zip(keys, self._fitted(self._width()), strict=True):
            key.description = text
        yield from items

    def _width(self) -> int:
        return self.size.width or self.app.size.width or 80

    def _fitted(self, width: int) -> list[str]:
        return footer_descriptions(getattr(self, "_full", []), width)

    async def on_resize(self, event: events.Resize) -> None:
        """A new width that changes which words fit: the keys again, fitted to it."""
        shown = [k.description for k in self.query(FooterKey)]
        if shown and shown != self._fitted(event.size.width):
            await self.recompose()

    def compact_watchers(self) -> int:
        """How many watcher entries Footer.compact has (tests: bounded across screen changes)."""
        return len(getattr(self, "__watchers", {}).get("compact", []))
