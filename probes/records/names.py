"""One name per memory counter per device, for every place that shows it: the panes at every
width, headless step lines, the rank table, the ledger, the report, the help and the README.

Each name fits a 20-column pane at 80×24 (≤ 9 characters), so no width needs a second name.
"""

from __future__ import annotations

# pane id -> device kind -> the counter's one name
COUNTER_NAMES: dict[str, dict[str, str]] = {
    "allocated": {"cpu": "heap used", "cuda": "allocated"},
    "reserved": {"cpu": "heap held", "cuda": "reserved"},
    "peak": {"cpu": "heap peak", "cuda": "peak"},
    "driver": {"cpu": "RSS", "cuda": "NVML used"},
}
# what a leak alert's ``counter`` field names (probes/instruments/leak.py), in words; short:
# where the alert must fit one 80-column line
LEAK_COUNTER_NAMES = {"device_allocated": "device allocated",
                      "host_heap": "host heap in use (mallinfo2)", "host_rss": "host RSS",
                      "workers_private": "DataLoader workers' private memory (USS)"}
LEAK_COUNTER_SHORT = {"device_allocated": "device allocated", "host_heap": "host heap",
                      "host_rss": "host RSS", "workers_private": "DataLoader workers"}
# what the ledger's last line (reserved − allocated) is on each device: glibc has no cache
CACHE_LINE = {"cpu": "malloc free", "cuda": "allocator cache"}
# when each reading is taken, said beside it where two moments meet
PANE_MOMENT = "end of step"
LEDGER_MOMENT = "end of forward"


def counter_name(pane_id: str, device_type: str) -> str:
    """The one name of a counter on a device ("cpu" or "cuda"); the id itself if unknown."""
    names = COUNTER_NAMES.get(pane_id)
    if names is None:
        return pane_id
    return names["cuda" if str(device_type).startswith("cuda") else "cpu"]


def counter_names(pane_id: str, *device_types: str) -> str:
    """A counter's name in a text about runs on ``device_types``: its one name where they share
    a device kind, both (CUDA's first) where they differ ("reserved / heap held")."""
    kinds = sorted({"cuda" if str(d).startswith("cuda") else "cpu" for d in device_types}
                   or {"cpu"}, key=lambda kind: kind != "cuda")
    return " / ".join(counter_name(pane_id, kind) for kind in kinds)


def peak_name(pane_id: str, *device_types: str) -> str:
    """The name of a counter's peak in a table of runs on ``device_types`` ("peak heap used"
    on CPU, "peak allocated" on CUDA; both where the runs differ)."""
    return "peak " + counter_names(pane_id, *device_types)
