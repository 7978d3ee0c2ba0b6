"""Allocated vs reserved with the peak line over the last steps (the tutorial's figure 3).

plotext costs ~30 ms of CPU per build with a few hundred points (docs/ARCHITECTURE.md), so the chart
is rebuilt only when the app hands it new data (every few seconds) or its size changes, and never
with more points than it is wide. A build's cost grows with the canvas (cells), so on a bigger
terminal the chart is rebuilt less often: CPU per second stays what it is on a 120x40 terminal
(benchmarks/RESULTS.md: the dashboard must cost the same at every size).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

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
        self.threaded_builds = 0  # how many of them ran off the event loop (render())
        self.threaded = True  # rebuild off the event loop (render())
        self.sync_next = False  # the next rebuild on the event loop (a screenshot wants it now)
        self._building: tuple[int, int, int] | None = None

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
        """Hand the new points to plotext at most every ``every_s`` (first points at once);
        ``force``: now, and built on the event loop (a screenshot is taken next)."""
        now = time.monotonic()
        if force:
            self.sync_next = True
        due = force or self.builds == 0 or now - self._drawn_at >= self.interval_s()
        if not self._pending or not due:
            return False
        pts = list(self.points)
        self.set_series([p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts], peak,
                        self._labels)
        self._pending = False
        self._drawn_at = now
        return True

    def title(self) -> str:
        """The box's title: which steps the figure holds and how often it is redrawn, so a
        chart a few seconds behind the header says so (issue 30)."""
        return chart_title(self._steps[0] if self._steps else None,
                           self._steps[-1] if self._steps else None, self.interval_s())

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
        """The cached figure; a rebuild runs on a thread (plotext is pure Python: ~30 ms at
        120x40, more on a bigger canvas, and a resize would otherwise stall the event loop for
        it), except the first one and one a screenshot forces (``sync_next``)."""
        key = (self._version, self.size.width, self.size.height)
        if key == self._cache_key and self._cache is not None:
            return self._cache
        data = (list(self._steps), list(self._alloc), list(self._reserved), self._peak,
                self._labels)
        theme = self._get_plotext_theme_name(self.app.theme)
        if self._cache is None or self.sync_next or not self.threaded:
            self.sync_next = False
            self._built(key, self._build_text(key, data, theme))
            return self._cache or Text()
        if self._building is None:
            self._building = key
            threading.Thread(target=self._build_off_loop, args=(self.app, key, data, theme),
                             name="memtop-chart", daemon=True).start()
        return self._cache

    def _build_off_loop(self, app: Any, key: tuple[int, int, int], data: tuple,
                        theme: str) -> None:
        try:
            text = self._build_text(key, data, theme)
        except Exception:  # a plotext failure keeps the last figure
            text = None
        with contextlib.suppress(RuntimeError):  # the app has gone meanwhile
            app.call_from_thread(self._built, key, text, True)

    def _built(self, key: tuple[int, int, int], text: Text | None,
               threaded: bool = False) -> None:
        self._building = None
        if text is not None:
            self._cache_key, self._cache = key, text
            self.builds += 1
            self.threaded_builds += 1 if threaded else 0
        if key != (self._version, self.size.width, self.size.height) or text is not None:
            self.refresh()

    def _build_text(self, key: tuple[int, int, int], data: tuple, theme: str) -> Text:
        """The figure for ``data`` at the key's size, as Text (one thread at a time)."""
        _, width, height = key
        plt = self.plt
        self._fill(plt, width, *data)
        plt.plotsize(width, height)
        plt._set_size(width, height)  # as PlotextPlot.render does (textual-plotext issue 5)
        plt.theme(theme)
        return Text.from_ansi(plt.build())

    def _fill(self, plt, size_width: int, steps: list[int], alloc_b: list[float],
              resv_b: list[float], peak: float | None, labels: tuple[str, str, str]) -> None:
        plt.clear_data()
        plt.clear_figure()
        width = max(10, size_width - 12)  # the y axis labels take some columns
        if not steps:
            plt.title("memory: waiting for the first steps")
            return
        top = max(max(resv_b, default=0.0), max(alloc_b, default=0.0), peak or 0.0)
        unit, div = byte_unit(top)
        n = min(width, len(steps))
        xs = downsample_max(steps, n)
        alloc = [v / div for v in downsample_max(alloc_b, n)]
        resv = [v / div for v in downsample_max(resv_b, n)]
        a_label, r_label, p_label = labels
        if resv:
            plt.plot(xs, resv, label=r_label, marker=MARKER, color="cyan")
        if alloc:
            plt.plot(xs, alloc, label=a_label, marker=MARKER, color="green")
        if peak is not None and xs:
            plt.plot([xs[0], xs[-1]], [peak / div] * 2, label=p_label, marker=MARKER,
                     color="red")
        plt.ylabel(unit)
        plt.xlabel("step")
        if xs:
            ticks = step_ticks(xs[0], xs[-1])
            plt.xticks(ticks, [f"{t:,}" for t in ticks])  # steps are whole: no "20.5"


def chart_title(first_step: int | None, last_step: int | None, every_s: float) -> str:
    """"memory, steps 12–840 · redrawn every 5 s"; before any step, the plain title."""
    if first_step is None or last_step is None:
        return "memory over recent steps"
    return f"memory, steps {first_step:,}–{last_step:,} · redrawn every {every_s:.0f} s"


def step_ticks(first: int, last: int, most: int = 5) -> list[int]:
    """At most ``most`` whole steps from ``first`` to ``last`` on a 1-2-5 spacing (plotext's own
    ticks fall between steps on a short run: "1.50")."""
    span = max(0, last - first)
    spacings = (m * 10**e for e in range(19) for m in (1, 2, 5))  # 1, 2, 5, 10, 20, 50 ...
    spacing = next(sp for sp in spacings if span // sp < most)
    start = -(-first // spacing) * spacing  # the first multiple of the spacing from first on
    return list(range(start, last + 1, spacing)) or [first]
