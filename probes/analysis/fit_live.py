"""The live "fits B ≤ …, T ≤ … on this device (±x%)" line: the ledger pane's and the report's,
from the running run's own measured parts (`memtop fit` measures several sizes; a run one).

From the last ledger event (probes/instruments/ledger.py, its measured step) and the steady
step rows after it:

- the run's level between steps (``base``): on CPU the process's RSS outside the heap plus the
  heap in use, at the measured step's start; on CUDA the allocated bytes then;
- the budget counter's peak: the median sampled value of the steady rows (CPU: RSS at step
  ends; CUDA: reserved), so ``step`` = peak − base is what one step adds;
- ``step`` scales with B (the activations, temporaries and the allocator's share grow with
  the batch), and with T, its T×T share (the measured attention scores over the forward's
  growth) with T²; the base does not.

The band is the sampled peak's spread over those rows (a range where it passes 5%). One size
measured: what grows but not in proportion (a constant in the step's part) is not seen;
`memtop fit` measures it.
Computed where the ledger event is read (the dashboard, the report), never on the step path.
No torch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from probes.analysis.fit import DEFAULT_HEADROOM_PCT, GOOD_FIT

STEADY_ROWS = 3  # steady rows after the ledger's step before the line is shown


def budget_counter(row: Any) -> int | None:
    """The counter the budget is against, in a step row (a dict or a StepSample): CUDA
    reserved, CPU process RSS."""
    get = row.get if isinstance(row, Mapping) else lambda k: getattr(row, k, None)
    if str(get("device") or "cpu").startswith("cuda"):
        return get("reserved_bytes")
    return get("host_rss_bytes")


class LivePeaks:
    """The budget counter of the steady rows after the current ledger event, kept as they
    arrive (the dashboard's ledger pane), at most ``keep`` of them."""

    def __init__(self, keep: int = 512) -> None:
        self.keep = keep
        self.ledger: Mapping[str, Any] | None = None
        self.values: list[int] = []

    def new_ledger(self, ledger: Mapping[str, Any]) -> None:
        self.ledger, self.values = ledger, []

    def add(self, rows: Sequence[Any]) -> bool:
        """True when a value was added (the line may have moved)."""
        if self.ledger is None:
            return False
        at = self.ledger.get("sampled_step") or 0
        added = False
        for r in rows:
            get = r.get if isinstance(r, Mapping) else lambda k, r=r: getattr(r, k, None)
            value = budget_counter(r)
            if (get("step") or 0) >= at and not get("disturbed") and isinstance(value, int):
                self.values.append(value)
                added = True
        del self.values[:-self.keep]
        return added

    def line(self) -> str | None:
        return live_line(live_fit(self.ledger, self.values)) if self.ledger else None


def live_fit(ledger: Mapping[str, Any], peaks: Sequence[int],
             headroom_pct: float = DEFAULT_HEADROOM_PCT) -> dict[str, Any] | None:
    """The live estimate, or None without what it needs (an older ledger event, no budget,
    fewer than STEADY_ROWS steady rows, a step that adds nothing). The peak is the steady
    rows' median (their largest picks one step's outlier); the band their spread."""
    rest = ledger.get("rest") if isinstance(ledger.get("rest"), Mapping) else {}
    b0 = ledger.get("batch_size") or ledger.get("batch_dim")
    t0 = ledger.get("seq_len")
    budget = ledger.get("budget_bytes")
    cuda = str(ledger.get("device") or "cpu").startswith("cuda")
    used, held, rss = rest.get("allocated"), rest.get("reserved"), rest.get("rss")
    base = used if cuda else (rss - held + used if None not in (rss, held, used) else None)
    values = [p for p in peaks if isinstance(p, int)]
    if not b0 or not budget or base is None or len(values) < STEADY_ROWS:
        return None
    peak = statistics.median(values)
    step = peak - base
    if step <= 0:
        return None
    limit = budget * (1.0 - headroom_pct / 100.0)
    band = (max(values) - min(values)) / peak

    def batch(room: float) -> int:
        return max(0, math.floor(b0 * (room - base) / step))

    out: dict[str, Any] = {"batch_size": b0, "seq_len": t0, "budget_bytes": budget,
                           "budget_source": ledger.get("budget_source"),
                           "headroom_pct": headroom_pct, "peak_bytes": int(peak),
                           "base_bytes": base, "step_bytes": int(step), "band": band,
                           "largest_batch": batch(limit), "batch_low": batch(limit / (1 + band)),
                           "batch_high": batch(limit / (1 - band)) if band < 1 else None,
                           "largest_seq": None, "capped_by_context": False,
                           "limit_bytes": int(limit), "today_over": peak > limit,
                           "world_size": ledger.get("world_size") or 1}
    if t0:
        grown = (ledger.get("allocated_bytes") or 0) - (used or 0)  # by the end of forward
        scores = ledger.get("attention_scores_bytes") or 0
        q = min(1.0, max(0.0, scores / grown)) if grown > 0 else 0.0
        room = (limit - base) / step  # x = T / T0 solves (1 - q)·x + q·x² = room
        x = room if q == 0 else (-(1 - q) + math.sqrt((1 - q) ** 2 + 4 * q * max(room, 0.0))
                                 ) / (2 * q)
        largest = max(0, math.floor(t0 * x)) if room > 0 else 0
        cap = ledger.get("max_seq_len")
        if cap and largest > cap:
            out["capped_by_context"], largest = True, cap
        out["largest_seq"] = largest
    return out


def live_line(live: Mapping[str, Any] | None) -> str | None:
    """"fits B ≤ 26, T ≤ 128 on this device (±0.4%)" (per rank under DDP); where the run's
    own size is past the budget less its headroom, "; B=16 T=128 is over the 10% headroom"."""
    if not live:
        return None
    b = live["largest_batch"]
    if live["band"] > GOOD_FIT and live.get("batch_high") is not None:  # as memtop fit does
        b = f"{live['batch_low']}–{live['batch_high']}"
    parts = [f"B ≤ {b}"]
    if live.get("largest_seq") is not None:
        parts.append(f"T ≤ {live['largest_seq']}"
                     + (" (the context)" if live.get("capped_by_context") else ""))
    where = "per rank" if (live.get("world_size") or 1) > 1 else "on this device"
    line = f"fits {', '.join(parts)} {where} (±{live['band']:.1%})"
    if live.get("today_over"):  # the run itself is past the line it answers under
        shape = f"B={live['batch_size']}" + (f" T={live['seq_len']}" if live.get("seq_len")
                                             else "")
        line += f"; {shape} is over the {live['headroom_pct']:g}% headroom"
    return line


def steady_peaks(ledger: Mapping[str, Any], rows: Sequence[Any]) -> list[int]:
    """The budget counter of the undisturbed step rows from the ledger's step on."""
    peaks = LivePeaks(keep=len(rows) + 1)
    peaks.new_ledger(ledger)
    peaks.add(rows)
    return peaks.values
