"""Prefill and decode throughput side by side, never averaged into one line (tutorial §5.3)."""

from __future__ import annotations

from collections import deque

from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import Static

from probes import records as R
from probes.records import StepSample
from tui.format_infer import phase_lines

HISTORY = 512  # steps kept per phase (the statistics are over these)


class PhaseThroughputPane(Widget):
    DEFAULT_CSS = """
    PhaseThroughputPane { height: 3; width: 1fr; padding: 0 1; }
    PhaseThroughputPane > .ph-title { height: 1; width: 1fr; color: $text-muted; }
    PhaseThroughputPane > .ph-line { height: 1; width: 1fr; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.prefill: deque[StepSample] = deque(maxlen=HISTORY)
        self.decode: deque[StepSample] = deque(maxlen=HISTORY)
        self._title = Static("prefill vs decode (warm-up excluded)",
                             classes="ph-title", markup=False)
        self._pre = Static("", classes="ph-line", markup=False)
        self._dec = Static("", classes="ph-line", markup=False)
        self._shown = ("", "")
        self._dirty = True

    def compose(self) -> ComposeResult:
        yield self._title
        yield self._pre
        yield self._dec

    def push(self, samples: list[StepSample]) -> None:
        """Take step rows; the steps a profiler window disturbed are left out (traced, its
        table computed, the 3 after: probes/records/disturbed.py)."""
        for s in samples:
            if R.is_disturbed(s) or s.phase not in R.PHASES:
                continue
            (self.prefill if s.phase == R.PREFILL else self.decode).append(s)
            self._dirty = True

    @property
    def text(self) -> tuple[str, str]:
        return self._shown

    def on_resize(self) -> None:
        self._dirty = True
        self.refresh_view()

    def refresh_view(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        # request 1 is the warm-up: shown until request 2 arrives, then left out
        if any((s.request or 0) > 1 for s in self.prefill):
            for rows in (self.prefill, self.decode):
                kept = [s for s in rows if (s.request or 0) > 1]
                rows.clear()
                rows.extend(kept)
        width = max(1, self.content_region.width or self.size.width or 30)
        shown = phase_lines(list(self.prefill), list(self.decode), width)
        if shown[0] != self._shown[0]:
            self._pre.update(shown[0], layout=False)
        if shown[1] != self._shown[1]:
            self._dec.update(shown[1], layout=False)
        self._shown = shown
