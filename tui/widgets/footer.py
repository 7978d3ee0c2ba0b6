"""Textual's Footer without the per-screen-change leak (Textual issue #6666).

Footer.compose data_binds every FooterKey to Footer.compact; the watcher entries of the keys a
recompose removes stay on the Footer for good, so every screen change (help open/close) kept ~9
FooterKeys with their render caches alive: RSS grew ~2 MiB per minute of help presses and every
later gen-2 gc pass on the UI thread walked them (benchmarks/RESULTS.md, ui_latency A/B).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Footer


class MemtopFooter(Footer):
    DEFAULT_CSS = """
    MemtopFooter { dock: bottom; }
    """

    def compose(self) -> ComposeResult:
        """Drop the watcher entries of keys no longer attached, then compose as Footer does."""
        watchers = getattr(self, "__watchers", {}).get("compact")
        if watchers:
            watchers[:] = [(r, cb) for r, cb in watchers if getattr(r, "is_attached", True)]
        yield from super().compose()

    def compact_watchers(self) -> int:
        """How many watcher entries Footer.compact has (tests: bounded across screen changes)."""
        return len(getattr(self, "__watchers", {}).get("compact", []))
