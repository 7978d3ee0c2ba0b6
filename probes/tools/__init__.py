"""The bottom layer: small pure helpers every other part of probes/ may use; imports nothing
else of memtop and never torch.

    from probes.tools import format_bytes, parse_size, percentile, Ring

    format_bytes(1536)          # '1.5 KiB' (binary units, as the allocator counts)
    parse_size("6GiB")          # 6442450944; ValueError with a plain sentence otherwise
    percentile([3.0, 1.0], 50)  # 2.0 (numpy's default interpolation)
    ring = Ring(maxlen=4096)    # the trainer thread pushes, the UI timer drains

Modules: units (human units and size parsing), stats (percentiles), ring (the thread hand-over
buffer), kvcache (the inference ledger's formulas), lazy (names a package offers before its
modules load).
"""

from __future__ import annotations

from probes.tools.kvcache import (
    DTYPE_BYTES,
    KV_FORMULA,
    Admission,
    admission,
    kv_bytes_per_token,
    kv_cache_bytes,
)
from probes.tools.lazy import lazy_exports
from probes.tools.ring import Ring
from probes.tools.stats import percentile
from probes.tools.units import format_bytes, format_rate, parse_size

__all__ = [
    "DTYPE_BYTES", "KV_FORMULA", "Admission", "admission", "kv_bytes_per_token",
    "kv_cache_bytes", "lazy_exports", "Ring", "percentile", "format_bytes", "format_rate",
    "parse_size",
]
