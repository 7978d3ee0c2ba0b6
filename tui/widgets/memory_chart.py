"""Allocated vs reserved with the peak line over the last steps (the tutorial's figure 3).

plotext costs ~30 ms of CPU per build with a few hundred points (DESIGN.md), so the chart is
rebuilt only when the app hands it new data (every few seconds) or its size changes, and never
with more points than it is wide. A build's cost grows with the canvas (cells), so on a bigger
terminal the chart is rebuilt less often: CPU per second stays what it is on a 120x40 terminal
(issue 18: the dashboard must cost the same at every size).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Sequence

from rich.text import Text
from textual.app import RenderResult
from textual_plotext import PlotextPlot

from tui.format_panels import byte_unit, downsample_max

# Quadrant blocks: cheap to build, and present in the fonts SVG viewers fall back to (braille
# glyphs come out wider than a cell there and spill over the neighbouring panes).
MARKER = "hd"
HISTORY = 2048  # (step, allocated, reserved) points kept, whatever the run length
REF_CELLS = 60 * 25  # the chart's canvas on a 120x40 terminal (58x25): every_s holds up to this


class MemoryChart(PlotextPlot):
    DEFAULT_CSS = """
    MemoryChart {
        width: 1fr;
        height: 1fr;
        min-height: 6;
    }
    """

    def __init__(self, labels: tuple[str, str, str] = ("allocated", "reserved", "peak"), *,
                 every_s: float = 5.0, id: str | None = None) -> None:
        super().__init__(id=id)
        self.every_s = every_s
        self.points: deque[tuple[int, int, int]] = deque(maxlen=HISTORY)
        self._pending = False
        self._drawn_at = 0.0
        self._steps: list[int] = []
        self._alloc: list[float] = []
        self._reserved: list[float] = []
        self._peak: float | None = None
        self._labels = labels
        self._version = 0
        self._cache_key: tuple[int, int, int] | None = None
        self._cache: Text | None = None
        self.builds = 0  # how many times plotext actually ran (tests, benchmarks)

    def add_points(self, samples: Iterable[object]) -> None:
        """Keep each StepSample's allocated/reserved; drawing waits for :meth:`maybe_redraw`."""
        for s in samples:
            alloc, resv = getattr(s, "allocated_bytes", None), getattr(s, "reserved_bytes", None)
            if alloc is not None and resv is not None:
                self.points.append((s.step, alloc, resv))
                self._pending = True

    def set_labels(self, labels: tuple[str, str, str]) -> None:
        """Series names (they depend on the device, which a viewer may learn late)."""
        if labels != self._labels:
            self._labels = labels
            self._pending = bool(self.points)

    def maybe_redraw(self, peak: float | None, force: bool = False) -> bool:
        """Hand the new points to plotext at most every ``every_s`` (first points at once)."""
        now = time.monotonic()
        due = force or self.builds == 0 or now - self._drawn_at >= self.interval_s()
        if not self._pending or not due:
            return False
        pts = list(self.points)
        self.set_series([p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts], peak,
                        self._labels)
        self._pending = False
        self._drawn_at = now
        return True

    def interval_s(self) -> float:
        """every_s, stretched by how much bigger than REF_CELLS the canvas is."""
        cells = self.size.width * self.size.height
        return self.every_s * max(1.0, cells / REF_CELLS)

    def set_series(self, steps: Sequence[int], allocated: Sequence[float],
                   reserved: Sequence[float], peak: float | None,
                   labels: tuple[str, str, str]) -> None:
        """New data; the next paint rebuilds the figure."""
        self._steps = list(steps)
        self._alloc = list(allocated)
        self._reserved = list(reserved)
        self._peak = peak
        self._labels = labels
        self._version += 1
        self.refresh()

    def render(self) -> RenderResult:
        key = (self._version, self.size.width, self.size.height)
        if key == self._cache_key and self._cache is not None:
            return self._cache
        self._build()
        text = super().render()
        self._cache_key = key
        self._cache = text if isinstance(text, Text) else None
        self.builds += 1
        return text

    def _build(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        width = max(10, self.size.width - 12)  # the y axis labels take some columns
        if not self._steps:
            plt.title("memory: waiting for the first steps")
            return
        top = max(max(self._reserved, default=0.0), max(self._alloc, default=0.0),
                  self._peak or 0.0)
        unit, div = byte_unit(top)
        n = min(width, len(self._steps))
        xs = downsample_max(self._steps, n)
        alloc = [v / div for v in downsample_max(self._alloc, n)]
        resv = [v / div for v in downsample_max(self._reserved, n)]
        a_label, r_label, p_label = self._labels
        if resv:
            plt.plot(xs, resv, label=r_label, marker=MARKER, color="cyan")
        if alloc:
            plt.plot(xs, alloc, label=a_label, marker=MARKER, color="green")
        if self._peak is not None and xs:
            plt.plot([xs[0], xs[-1]], [self._peak / div] * 2, label=p_label, marker=MARKER,
                     color="red")
        plt.ylabel(unit)
        plt.xlabel("step")
