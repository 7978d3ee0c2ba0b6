"""The inference ledger's two numbers (tutorial §5.2): what the KV cache should hold, and how
many concurrent sequences a memory budget admits.

Plain arithmetic, no torch: the formula is what memtop checks the measured cache against, and the
admission line is what the dashboard and the report show.
"""

from __future__ import annotations

from dataclasses import dataclass

from probes.tools.units import format_bytes

KV_FORMULA = "2 × layers × B × T × dim × bytes/element"
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "off": 4}  # the cache's dtype follows the amp mode


def kv_cache_bytes(layers: int, batch: int, tokens: int, dim: int, bytes_per_element: int) -> int:
    """Keys and values (the 2) of every layer for B sequences of T positions, dim wide."""
    return 2 * layers * batch * tokens * dim * bytes_per_element


def kv_bytes_per_token(layers: int, dim: int, bytes_per_element: int) -> int:
    """What one more position of one sequence adds to the cache."""
    return kv_cache_bytes(layers, 1, 1, dim, bytes_per_element)


@dataclass(frozen=True)
class Admission:
    """How many sequences of ``seq_len`` tokens fit in ``budget_bytes`` beside what is held."""

    budget_bytes: int
    budget_source: str  # "device total", "host RAM", "--max-memory"
    used_bytes: int  # held before any request: weights, runtime, allocator
    weights_bytes: int
    kv_bytes_per_sequence: int
    temp_bytes_per_sequence: int  # measured: the prefill's transient peak per sequence
    seq_len: int
    sequences_fit: int
    limit: str  # what bounds it, in words
    limit_kind: str  # "weights" | "held memory" | "KV cache" | "temporaries"

    def to_json(self) -> dict[str, object]:
        from dataclasses import asdict

        return asdict(self)


def admission(budget_bytes: int, budget_source: str, used_bytes: int, weights_bytes: int,
              kv_bytes_per_sequence: int, temp_bytes_per_sequence: int, seq_len: int) \
        -> Admission:
    """Sequences that fit: (budget - used) // (cache + temporaries per sequence).

    Temporaries (prefill activations, the attention scores) are freed after the prefill, but
    sequences admitted together prefill together, so each admitted sequence needs its share.
    """
    per_seq = max(1, kv_bytes_per_sequence + max(0, temp_bytes_per_sequence))
    free = budget_bytes - used_bytes
    fit = max(0, free // per_seq)
    if weights_bytes >= budget_bytes:
        kind, limit = "weights", f"weights ({format_bytes(weights_bytes)}) alone exceed the budget"
    elif free <= 0:
        kind = "held memory"
        limit = f"what is already held ({format_bytes(used_bytes)}) fills the budget"
    elif kv_bytes_per_sequence >= temp_bytes_per_sequence:
        kind = "KV cache"
        limit = (f"the KV cache: {format_bytes(kv_bytes_per_sequence)} per sequence vs "
                 f"{format_bytes(max(0, temp_bytes_per_sequence))} temporaries")
    else:
        kind = "temporaries"
        limit = (f"prefill temporaries: {format_bytes(temp_bytes_per_sequence)} per sequence vs "
                 f"{format_bytes(kv_bytes_per_sequence)} KV cache")
    return Admission(budget_bytes, budget_source, used_bytes, weights_bytes,
                     kv_bytes_per_sequence, max(0, temp_bytes_per_sequence), seq_len, int(fit),
                     limit, kind)
