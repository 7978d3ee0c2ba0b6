"""The KV cache growing step by step, measured beside 2 × layers × B × T × dim × bytes."""

from __future__ import annotations

from collections import deque

from probes.records import StepSample
from tui.format_infer import kv_lines
from tui.widgets.line_pane import LinePane

HISTORY = 512


class KvCachePane(LinePane):
    def __init__(self, block_size: int | None = None, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.block_size = block_size
        self.history: deque[float] = deque(maxlen=HISTORY)
        self.last: StepSample | None = None
        self._dirty = True

    def push(self, samples: list[StepSample]) -> None:
        for s in samples:
            if s.kv_cache_bytes is not None:
                self.history.append(float(s.kv_cache_bytes))
                self.last = s
                self._dirty = True

    @property
    def text(self) -> tuple[str, str]:
        return self.lines

    def on_resize(self) -> None:
        self._dirty = True
        self.refresh_view()

    def refresh_view(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        width = max(1, self.content_region.width or self.size.width or 30)
        top, sub = kv_lines(self.last, self.block_size, width)
        self.show(top, sub, list(self.history)[-width:])
