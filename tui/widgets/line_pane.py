"""A three-line pane drawn straight into Strips (Textual's line API): a bold line, a muted line
and a sparkline of recent values. MetricPane and KvCachePane are this.

One widget instead of a container with two Statics and a Sparkline: Textual's Sparkline yields
one Rich Segment and Style per bar, which the compositor splits, crops and filters, and every
child is a widget the compositor walks at each 2 Hz tick. Drawn here as at most ten text runs,
and only when a line changed, the dashboard's UI thread costs about half as much per tick
(benchmarks/RESULTS.md, "Dashboard UI thread").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip
from textual.widget import Widget

from tui.charts import SPARK_BARS, bar_levels, bar_runs


class LinePane(Widget):
    """``show(top, sub, points)`` sets what is drawn; unchanged lines are not redrawn."""

    # The top line takes the pane's own colour (bold). Two component classes, not more: each
    # is a virtual node Textual restyles at every style pass (a screen pushed or popped), and
    # those become garbage for the cyclic collector (benchmarks/RESULTS.md, "UI stalls").
    COMPONENT_CLASSES: ClassVar[set[str]] = {"line-pane--sub", "line-pane--spark"}

    DEFAULT_CSS = """
    LinePane { height: 3; width: 1fr; padding: 0 1; }
    LinePane > .line-pane--sub { color: $text-muted; }
    LinePane > .line-pane--spark { color: $primary; }
    """

    SPARK_MIN_ALPHA = 0.3  # the lowest bar's colour: the spark colour at this opacity

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._lines: tuple[str, str] = ("", "")
        self._points: list[float] = []
        self._strips: dict[int, Strip] = {}  # row -> drawn strip, for the current width
        self._strip_width = -1
        self._styles: tuple[Style, Style, list[Style]] | None = None

    # what is shown ---------------------------------------------------------------------------
    @property
    def lines(self) -> tuple[str, str]:
        return self._lines

    @property
    def points(self) -> list[float]:
        """The values the sparkline draws (no more than the pane is wide)."""
        return self._points

    def show(self, top: str, sub: str, points: Sequence[float]) -> None:
        points = list(points)
        changed = [row for row, (old, new) in enumerate(
            ((self._lines[0], top), (self._lines[1], sub), (self._points, points)))
            if old != new]
        if not changed:
            return
        self._lines, self._points = (top, sub), points
        for row in changed:
            self._strips.pop(row, None)
        self.refresh()

    # drawing -------------------------------------------------------------------------------------
    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles = None  # a theme or class change (an alert): new colours
        self._strips.clear()

    def _get_styles(self) -> tuple[Style, Style, list[Style]]:
        """Top, sub and one style per bar level (cached: reading component styles walks the
        DOM)."""
        if self._styles is None:
            _, base = self.background_colors
            spark = self.get_component_styles("line-pane--spark").color
            lo = base + spark.multiply_alpha(self.SPARK_MIN_ALPHA)
            hi = base + spark
            top = len(SPARK_BARS) - 1
            bars = [Style(color=lo.blend(hi, level / top).rich_color, bgcolor=base.rich_color)
                    for level in range(len(SPARK_BARS))]
            self._styles = (self.rich_style + Style(bold=True),
                            self.get_component_rich_style("line-pane--sub"), bars)
        return self._styles

    def _draw(self, row: int, width: int) -> Strip:
        top_style, sub_style, bars = self._get_styles()
        if row < 2:
            style = top_style if row == 0 else sub_style
            return Strip([Segment(self._lines[row], style)]).adjust_cell_length(width, style)
        data = self._points
        if not data:
            levels = [0] * width
        elif len(data) == 1:
            levels = [len(SPARK_BARS) - 1] * width
        else:
            levels = bar_levels(data, width)
        return Strip([Segment(SPARK_BARS[level] * count, bars[level])
                      for level, count in bar_runs(levels)], width)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y > 2 or width <= 0:
            return Strip.blank(max(0, width), self.rich_style)
        if width != self._strip_width:
            self._strips.clear()
            self._strip_width = width
        strip = self._strips.get(y)
        if strip is None:
            strip = self._strips[y] = self._draw(y, width)
        return strip
