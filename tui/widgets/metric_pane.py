"""One metric: label + current value, min/max over the window, and a Sparkline of recent steps."""

from __future__ import annotations

from collections import deque

from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import Sparkline, Static

from tui.format import NA, format_scale, format_value, label_value_line, range_text

HISTORY = 512  # values kept per pane, whatever the run length


class MetricPane(Widget):
    """Bounded history; ``refresh_view`` touches only the labels whose text changed."""

    DEFAULT_CSS = """
    MetricPane {
        height: 3;
        width: 1fr;
        padding: 0 1;
    }
    MetricPane > .pane-top { height: 1; width: 1fr; text-style: bold; }
    MetricPane > .pane-range { height: 1; width: 1fr; color: $text-muted; }
    MetricPane > Sparkline { height: 1; width: 1fr; }
    MetricPane.-alert { background: $error 40%; }
    MetricPane.-alert > .pane-top { color: $text-error; }
    """

    def __init__(self, pane_id: str, label: str, kind: str, short_label: str | None = None) -> None:
        super().__init__(id=f"pane-{pane_id}")
        self.pane_id = pane_id
        self.label = label
        self.short_label = short_label
        self.kind = kind
        self.history: deque[float] = deque(maxlen=HISTORY)
        self.current: float | None = None
        self.note: str | None = None  # replaces the min/max line (e.g. skipped steps)
        self._top = Static("", classes="pane-top", markup=False)
        self._range = Static("", classes="pane-range", markup=False)
        self._spark = Sparkline([])
        self._shown: tuple[str, str] = ("", "")
        self._dirty = True

    def compose(self) -> ComposeResult:
        yield self._top
        yield self._range
        yield self._spark

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
        return self._shown[0]

    @property
    def range_line(self) -> str:
        return self._shown[1]

    @property
    def spark_points(self) -> int:
        return len(self._spark.data or [])

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
            rng = self.note[:width]
        elif self.history:
            rng = range_text(self.kind, min(self.history), max(self.history), width)
        else:
            rng = range_text(self.kind, None, None, width)
        if top != self._shown[0]:
            self._top.update(top, layout=False)
        if rng != self._shown[1]:
            self._range.update(rng, layout=False)
        self._shown = (top, rng)
        n = max(1, self._spark.size.width or width)
        # A new list each time: Sparkline redraws when its reactive is assigned.
        self._spark.data = list(self.history)[-n:]
