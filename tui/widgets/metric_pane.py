"""One metric: label + current value, min/max over the window, a sparkline of recent steps."""

from __future__ import annotations

from collections import deque

from probes.tools.units import NA
from tui.format import fit_note, format_scale, format_value, label_value_line, range_text
from tui.widgets.line_pane import LinePane

HISTORY = 512  # values kept per pane, whatever the run length


class MetricPane(LinePane):
    """Bounded history; ``refresh_view`` redraws only the lines whose text changed."""

    DEFAULT_CSS = """
    MetricPane.-alert { background: $error 40%; color: $text-error; }
    """

    def __init__(self, pane_id: str, label: str, kind: str, short_label: str | None = None) -> None:
        super().__init__(id=f"pane-{pane_id}")
        self.pane_id = pane_id
        self.label = label
        self.short_label = short_label
        self.kind = kind
        self.history: deque[float] = deque(maxlen=HISTORY)
        self.taken = 0  # values taken over the run (the history keeps the last HISTORY)
        self.current: float | None = None
        self.note: str | None = None  # replaces the min/max line (e.g. skipped steps)
        self._dirty = True

    def on_resize(self) -> None:
        self._dirty = True
        self.refresh_view()

    def push(self, values: list[float | None]) -> None:
        """Add this refresh's values (oldest first); None is shown as n/a, never plotted."""
        if not values:
            return
        for v in values:
            if v is not None:
                self.history.append(float(v))
                self.taken += 1
        self.current = values[-1]
        self._dirty = True

    def relabel(self, label: str, short_label: str | None = None) -> None:
        """A new label (a viewer learns the device late; a loop may count samples, not
        tokens)."""
        if (label, short_label) != (self.label, self.short_label):
            self.label, self.short_label = label, short_label
            self._dirty = True

    def set_note(self, note: str | None) -> None:
        if note != self.note:
            self.note = note
            self._dirty = True

    @property
    def top_text(self) -> str:
        return self.lines[0]

    @property
    def range_line(self) -> str:
        return self.lines[1]

    @property
    def spark_points(self) -> int:
        return len(self.points)

    def refresh_view(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        width = max(1, self.content_region.width or self.size.width or 20)
        if self.current is None:
            value = format_scale(None) if self.kind == "scale" else NA
        else:
            value = format_value(self.kind, self.current)
        top = label_value_line(self.label, value, width, self.short_label)
        if self.note is not None:
            rng = fit_note(self.note, width)
        elif self.history:
            rng = range_text(self.kind, min(self.history), max(self.history), width)
        else:
            rng = range_text(self.kind, None, None, width)
        self.show(top, rng, list(self.history)[-width:])
