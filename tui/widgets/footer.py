"""Textual's Footer without the per-screen-change leak (Textual issue #6666).

Footer.compose data_binds every FooterKey to Footer.compact; the watcher entries of the keys a
recompose removes stay on the Footer for good, so every screen change (help open/close) kept ~9
FooterKeys with their render caches alive: RSS grew ~2 MiB per minute of help presses and every
later gen-2 gc pass on the UI thread walked them (benchmarks/RESULTS.md, ui_latency A/B).

Its keys fit the row: where the full words do not, shorter ones, then descriptions cut with
"…" (tui/format.py footer_descriptions); Textual's footer cut the last key mid-word ("q q").

It recomposes only when the keys it would show changed. Textual's recomposes at every bindings
update of its screen, and closing the help screen sends one or two with the same keys: each made
~10 new FooterKeys (two virtual DOM nodes, styles, render caches each) that died a few frames
later in reference cycles, ~23 per help open/close, which made most of the gen-2 gc passes' work
on the UI thread (benchmarks/RESULTS.md, "the help screen's garbage").
"""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from tui.format import footer_descriptions


class MemtopFooter(Footer):
    DEFAULT_CSS = """
    MemtopFooter { dock: bottom; }
    """
    _composed_keys: tuple | None = None  # shown_keys() at the last compose

    def compose(self) -> ComposeResult:
        """Drop the watcher entries of keys no longer attached, then compose as Footer does."""
        watchers = getattr(self, "__watchers", {}).get("compact")
        if watchers:
            watchers[:] = [(r, cb) for r, cb in watchers if getattr(r, "is_attached", True)]
        self._composed_keys = self.shown_keys()
        items = list(super().compose())
        keys = [w for w in items if isinstance(w, FooterKey)]
        self._full = [(k.key_display, k.description) for k in keys]
        for key, text in zip(keys, self._fitted(self._width()), strict=True):
            key.description = text
        yield from items

    def shown_keys(self) -> tuple | None:
        """What compose would show, as values (the screen's active bindings with their states,
        and whether the palette key is shown); None before the bindings are ready."""
        if not self._bindings_ready:
            return None
        palette = self.show_command_palette and self.app.ENABLE_COMMAND_PALETTE
        bindings = self.screen.active_bindings.items()
        return palette, tuple((key, b, enabled, tip) for key, (_, b, enabled, tip) in bindings)

    def bindings_changed(self, screen: Screen) -> None:
        """As Footer's, but the recompose waits for a refresh and then runs only if the keys
        changed."""
        self._bindings_ready = True
        if screen.app.app_focus and self.is_attached and screen is self.screen:
            self.call_after_refresh(self._recompose_if_changed)

    async def _recompose_if_changed(self) -> None:
        if self.is_attached and self.shown_keys() != self._composed_keys:
            await self.recompose()

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
