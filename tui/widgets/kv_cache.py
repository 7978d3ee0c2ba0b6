"""The KV cache growing step by step, measured beside 2 × layers × B × T × dim × bytes."""

from __future__ import annotations

from collections import deque

from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import Sparkline, Static

from probes.records import StepSample
from tui.format_infer import kv_lines

HISTORY = 512


class KvCachePane(Widget):
    DEFAULT_CSS = """
    KvCachePane { height: 3; width: 1fr; padding: 0 1; }
    KvCachePane > .kv-top { height: 1; width: 1fr; text-style: bold; }
    KvCachePane > .kv-sub { height: 1; width: 1fr; color: $text-muted; }
    KvCachePane > Sparkline { height: 1; width: 1fr; }
    """

    def __init__(self, block_size: int | None = None, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.block_size = block_size
        self.history: deque[float] = deque(maxlen=HISTORY)
        self.last: StepSample | None = None
        self._top = Static("", classes="kv-top", markup=False)
        self._sub = Static("", classes="kv-sub", markup=False)
        self._spark = Sparkline([])
        self._shown = ("", "")
        self._dirty = True

    def compose(self) -> ComposeResult:
        yield self._top
        yield self._sub
        yield self._spark

    def push(self, samples: list[StepSample]) -> None:
        for s in samples:
            if s.kv_cache_bytes is not None:
                self.history.append(float(s.kv_cache_bytes))
                self.last = s
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
        width = max(1, self.content_region.width or self.size.width or 30)
        shown = kv_lines(self.last, self.block_size, width)
        if shown[0] != self._shown[0]:
            self._top.update(shown[0], layout=False)
        if shown[1] != self._shown[1]:
            self._sub.update(shown[1], layout=False)
        self._shown = shown
        n = max(1, self._spark.size.width or width)
        self._spark.data = list(self.history)[-n:]
