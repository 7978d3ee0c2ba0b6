"""What `memtop fit` measures before it fits (probes/analysis/fit.py): whether a budget can hold
the model at all, and the probe's (B, T) points, smallest first. No torch."""

from __future__ import annotations

from collections.abc import Sequence

VARY = ("batch", "context", "both")


STATE_BYTES_PER_PARAM = 16  # fp32 parameters, their gradients and AdamW's two moments


def model_size_problem(budget_bytes: int, params: int, what: str = "--memory") -> str | None:
    """Why a budget cannot hold the model at all (its parameters, gradients and AdamW's
    state), in one sentence; None when it can."""
    from probes.tools.units import format_bytes

    states = params * STATE_BYTES_PER_PARAM
    if budget_bytes >= states:
        return None
    return (f"{what} {format_bytes(budget_bytes)} is below the model's own size, "
            f"{format_bytes(states)} (parameters, gradients and AdamW's two moments: "
            f"{params:,} params × {STATE_BYTES_PER_PARAM} B)")


def probe_grid(batch_size: int, seq_len: int, vary: str,
               batches: Sequence[int] | None = None,
               seq_lens: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """(B, T) points in the order they run, smallest footprint (B·T) first. ``batch``: B in
    ``batches`` (1, 2, 4) at today's T; ``context``: T in ``seq_lens`` (T/4, T/2, T) at today's
    B; ``both``: the batch points, and the context points at the largest probed B (small
    points: the probe stays short). ValueError when the axis cannot vary."""
    if vary not in VARY:
        raise ValueError(f"--vary must be one of {', '.join(VARY)}, got {vary!r}")
    bs = sorted(set(batches or (1, 2, 4)))
    ts = sorted(set(seq_lens or (t for t in (seq_len // 4, seq_len // 2, seq_len) if t >= 1)))
    if any(b < 1 for b in bs) or any(t < 1 for t in ts):
        raise ValueError("probe points need B and T of at least 1")
    if vary != "batch" and len(ts) < (2 if seq_lens else 3):
        raise ValueError(f"--vary {vary} probes T at several lengths up to --seq-len "
                         f"{seq_len}; give a --seq-len of at least 4")
    t_ref, b_ref = max(ts), max(bs)
    if vary == "batch":
        points = [(b, seq_len) for b in bs]
    elif vary == "context":
        points = [(batch_size, t) for t in ts]
    else:
        points = [(b, t_ref) for b in bs] + [(b_ref, t) for t in ts]
    unique = list(dict.fromkeys(points))
    return sorted(unique, key=lambda p: (p[0] * p[1], p[0]))
