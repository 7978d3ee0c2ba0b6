"""The one-line header: device, amp, B/T, params, step, elapsed and the run state."""

from __future__ import annotations

from tui.widgets.text_line import TextLine


class MemtopHeader(TextLine):
    """A fixed one-line label: updates skip the re-layout (docs/ARCHITECTURE.md)."""

    DEFAULT_CSS = """
    MemtopHeader {
        height: 1;
        width: 1fr;
        background: $primary-background;
        color: $text;
        text-style: bold;
    }
    MemtopHeader.-paused { background: $warning-darken-2; }
    MemtopHeader.-ended { background: $surface-lighten-1; }
    MemtopHeader.-failed { background: $error-darken-1; }
    MemtopHeader.-profiling { background: $accent-darken-2; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self._state = ""

    def show(self, text: str, state: str) -> None:
        """Redraw only when the text or the state changed."""
        if state != self._state:
            self.set_class(state in ("finished", "stopped", "interrupted", "not live"), "-ended")
            for name in ("paused", "failed", "profiling"):
                self.set_class(state == name or (name == "paused" and state == "pausing"),
                               f"-{name}")
            self._state = state
        self.set_text(text)

