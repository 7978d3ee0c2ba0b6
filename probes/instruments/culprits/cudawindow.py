"""On CUDA, the allocator's history between the finder's two looks: turned on at the first look
(``torch.cuda.memory._record_memory_history``, Python stacks, a bounded ring of entries), read
at the second (one ``_snapshot()``), then turned off again unless the run records it anyway
(``--memory-history``). What was allocated in the window and is still alive is grouped by the
first frame of the user's code (probes/traces/snapshot.py, the same grouping ``memtop
snapshot`` shows), so a kept device tensor is named by the line that allocated it. The time
it costs (on, snapshot, off) is recorded in the event. Checked on a GPU only:
benchmarks/gpu/claims/culprits.py."""

from __future__ import annotations

import time
from typing import Any

import torch

from probes.counters.cudamem import history_kwargs
from probes.traces.snapshot import Site, live_by_site

WINDOW_ENTRIES = 20_000  # alloc/free entries kept between the looks (~1,100 per default step)


class CudaWindow:
    """History on between the looks; ``stop`` returns what the window left alive."""

    def __init__(self, max_entries: int = WINDOW_ENTRIES) -> None:
        self.max_entries = max_entries
        self.active = False
        self.ours = False
        self.since_us = 0
        self.cost_s = 0.0

    def start(self, device: torch.device, already_on: bool) -> None:
        if device.type != "cuda":
            return
        t0 = time.perf_counter()
        self.since_us = int(time.time() * 1e6)  # trace entries are stamped in wall-clock µs
        if not already_on:
            torch.cuda.memory._record_memory_history(**history_kwargs(self.max_entries))
            self.ours = True
        self.active = True
        self.cost_s = time.perf_counter() - t0

    def stop(self, device: torch.device) -> list[Site]:
        if not self.active:
            return []
        t0 = time.perf_counter()
        try:
            snap: dict[str, Any] = torch.cuda.memory._snapshot()
        finally:
            self.cancel()
        index = device.index if device.index is not None else torch.cuda.current_device()
        traces = snap.get("device_traces") or []
        mine = traces[index] if index < len(traces) else []
        self.cost_s += time.perf_counter() - t0
        return live_by_site(mine, since_us=self.since_us)

    def cancel(self) -> None:
        if self.ours:
            torch.cuda.memory._record_memory_history(enabled=None)
        self.ours = self.active = False
