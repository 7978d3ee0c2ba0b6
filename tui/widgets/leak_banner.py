"""The leak alert: a banner that says what grows, how fast, since when, and what to do."""

from __future__ import annotations

import time
from typing import Any

from probes import records as R
from tui.format import fit_lines
from tui.format_panels import leak_banner_text, leak_cleared_text
from tui.widgets.text_line import TextLine

CLEARED_SHOW_S = 10.0  # how long "leak cleared" stays before the banner hides
MAX_LINES = 4  # the banner's max-height; a longer text is cut with "…" (the event has it all)


class LeakBanner(TextLine):
    RELAYOUT = True  # its height follows the text
    """Hidden until a ``leak_suspected`` event; shows every counter that is still growing."""

    DEFAULT_CSS = """
    LeakBanner {
        display: none;
        height: auto;
        max-height: 4;  /* MAX_LINES */
        width: 1fr;
        padding: 0 1;
        background: $error;
        color: $text;
    }
    LeakBanner.-shown { display: block; }
    LeakBanner.-cleared { background: $success-darken-2; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.alerts: dict[str, dict[str, Any]] = {}
        self._cleared_at: float | None = None
        self.ended = False  # the run is over: its ETAs were at its end, and w looks no more

    def suspected(self, step: int, data: dict[str, Any]) -> None:
        counter = str(data.get("counter", "?"))
        self.alerts[counter] = dict(data, _step=step)
        self._cleared_at = None
        self._render_alerts()

    def forecast(self, step: int, data: dict[str, Any]) -> None:
        """A recomputed time to full (``leak_forecast``): the ETA follows the rate."""
        counter = str(data.get("counter", "?"))
        if counter in self.alerts:
            self.alerts[counter].update(data)
            self._render_alerts()

    def guard_stopped(self, step: int, data: dict[str, Any]) -> None:
        """The memory guard stopped the run (``memory_guard``): its forecast is the newest, so
        an open alert's time to full is the guard's, not the one recomputed seconds before."""
        fill = {k: data[k] for k in ("steps_to_full", "seconds_to_full") if k in data}
        if fill and self.alerts:
            for alert in self.alerts.values():
                alert.update(fill)
            self._render_alerts()

    def run_ended(self) -> None:
        """The run is over (or a viewer opened a finished one): say the alert was open at its
        end, and offer no `w`, which has no run to look into."""
        if not self.ended:
            self.ended = True
            if self.alerts:
                self._render_alerts()

    def cleared(self, step: int, data: dict[str, Any]) -> None:
        counter = str(data.get("counter", "?"))
        self.alerts.pop(counter, None)
        if self.alerts:
            self._render_alerts()
            return
        self._show(leak_cleared_text(data, step), cleared=True)
        self._cleared_at = time.monotonic()

    def tick(self) -> None:
        """Hide a "cleared" note after a while (called from the app's refresh)."""
        if self._cleared_at is not None and time.monotonic() - self._cleared_at > CLEARED_SHOW_S:
            self._cleared_at = None
            self.set_class(False, "-shown")

    def on_resize(self) -> None:
        if self.alerts:
            self._render_alerts()

    def _render_alerts(self) -> None:
        compact = (self.size.width or self.app.size.width) < 100
        head = "LEAK: " if compact else "LEAK SUSPECTED: "
        if self.ended:
            head = "LEAK at the end: " if compact else "LEAK SUSPECTED, open at the run's end: "
        room = (self.size.width or self.app.size.width) - 2 - len(head)  # less the padding
        # the time to full is the latest forecast's: say so (the report gives the alert's)
        when = "at the run's end" if self.ended else "now"
        lines, hint = leak_banner_text(self.alerts, compact, room, when)
        text = head + lines.replace("\n", "\n" + head)
        hinted = next((d for d in reversed(list(self.alerts.values())) if d.get("hint")), {})
        if hint and hinted.get("counter") == R.WORKERS_COUNTER:  # other processes' memory
            text += f"\nthe workers' pattern (from /proc; w cannot walk their objects): {hint}"
        elif hint:
            looks = "" if self.ended else " (w names the holder)"
            text += f"\na guess from the rate{looks}: {hint}"
        self._show(text, cleared=False)

    def _show(self, text: str, cleared: bool) -> None:
        self.set_class(cleared, "-cleared")
        self.set_class(True, "-shown")
        width = (self.size.width or self.app.size.width) - 2  # the padding
        self.set_text(fit_lines(text, width, MAX_LINES))

    @property
    def shown(self) -> bool:
        return self.has_class("-shown")
