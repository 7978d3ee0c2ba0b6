"""Ranks side by side: each rank's memory counters, step time and throughput, the spread across
ranks, and what stands out (the slowest rank, the highest peak, a leaking or failed rank).

Sized for 80×24 with up to 8 ranks: the min / median / max rows right under the ranks' counters,
then each rank's phase medians under their own header; when the box is short, the min/max rows go
first and the highlights share one line. The text is built by a pure function
(``rank_table_lines``).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from probes.analysis.ranks import slowest_rank, slowest_text
from probes.analysis.step_split import SHORT, phase_medians
from probes.records import SPLIT_FIELDS, StepSample, counter_name
from probes.tools.units import NA, format_bytes, format_ms, format_rate
from tui.format import fit
from tui.widgets.text_line import TextLine

RECENT_STEPS = 20  # step time per rank: median of the last steps (one step is noisy)
# the four counters' titles are their one name on the run's device (probes/records/names.py)
COLUMNS = (("allocated", None), ("reserved", None), ("peak", None), ("driver", None),
           ("step_ms", "step"), ("tokens", "tok/s"))


def column_titles(device_type: str) -> list[str]:
    """The columns' titles: each memory counter by its one name (≤ 9 characters: a cell)."""
    return [title or counter_name(name, device_type) for name, title in COLUMNS]


@dataclass
class RankRow:
    rank: int
    last: StepSample | None = None
    recent_ms: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))
    recent: deque[StepSample] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))
    leak: str | None = None  # the counter a leak is suspected in
    failed: str | None = None
    finished: bool = False

    def values(self) -> dict[str, float | None]:
        s = self.last
        if s is None:
            return {name: None for name, _ in COLUMNS}
        return {"allocated": s.allocated_bytes, "reserved": s.reserved_bytes,
                "peak": s.peak_allocated_bytes, "driver": s.driver_used_bytes,
                "step_ms": statistics.median(self.recent_ms) if self.recent_ms else None,
                "tokens": s.tokens_per_s if s.tokens_per_s is not None else s.samples_per_s}

    def phases(self) -> dict[str, float | None]:
        """This rank's phase medians over its recent steps (issue 26)."""
        return phase_medians(self.recent)


def _cell(name: str, value: float | None) -> str:
    if value is None:
        return NA
    if name == "step_ms":
        return format_ms(value)
    if name == "tokens":
        return format_rate(value)
    return format_bytes(value)


def _row(label: str, cells: list[str], note: str, width: int) -> str:
    text = f"{label:>6} " + " ".join(f"{c:>9}" for c in cells)
    return fit(f"{text}  {note}".rstrip(), width)


def highlights(rows: list[RankRow]) -> list[str]:
    """The slowest rank (the one the others wait for, probes/analysis/ranks.py: the report's
    definition), the highest peak and its excess over the median, leaking and failed ranks."""
    out = []
    vals = {r.rank: r.values() for r in rows}
    if sum(1 for r in rows if r.recent) > 1:
        out.append(slowest_text(slowest_rank({r.rank: r.recent for r in rows})))
    peaks = {k: v["peak"] for k, v in vals.items() if v["peak"] is not None}
    if len(peaks) > 1:
        top = max(peaks, key=lambda k: peaks[k])
        excess = peaks[top] - statistics.median(peaks.values())
        out.append(f"highest peak: rank {top}, {format_bytes(peaks[top])}, "
                   f"+{format_bytes(excess)} over median")
    for r in rows:
        if r.leak:
            out.append(f"LEAK suspected on rank {r.rank} ({r.leak})")
        if r.failed:
            out.append(f"rank {r.rank} FAILED: {' '.join(r.failed.split())}")
    return out


def phase_rows(rows: list[RankRow], width: int) -> list[str]:
    """Each rank's phase medians (ms) under a header, or nothing when no rank has any."""
    medians = {r.rank: r.phases() for r in rows}
    if all(v is None for m in medians.values() for v in m.values()):
        return []
    head = _row("split", [SHORT[n] for n in SPLIT_FIELDS], "(median)", width)
    return [head] + [_row(str(rank), [format_ms(m[n]) for n in SPLIT_FIELDS], "", width)
                     for rank, m in sorted(medians.items())]


def rank_table_lines(rows: list[RankRow], width: int, height: int) -> list[str]:
    """The table as fixed-width lines that fit ``width`` × ``height`` (height ≥ 3)."""
    rows = sorted(rows, key=lambda r: r.rank)
    device = next((r.last.device for r in rows if r.last is not None), "cpu")
    head = _row("rank", column_titles(device), "", width)
    lines = [head]
    for r in rows:
        v = r.values()
        note = "leak" if r.leak else ("FAILED" if r.failed else ("done" if r.finished else ""))
        lines.append(_row(str(r.rank), [_cell(n, v[n]) for n, _ in COLUMNS], note, width))
    spread_rows: list[str] = []
    if len(rows) > 1:
        columns = {n: [r.values()[n] for r in rows] for n, _ in COLUMNS}

        def stat(fn: Callable[[list[float]], float], label: str) -> str:
            cells = []
            for name, _ in COLUMNS:
                known = [x for x in columns[name] if x is not None]
                cells.append(_cell(name, fn(known)) if known else NA)
            return _row(label, cells, "", width)

        spread_rows = [stat(min, "min"), stat(statistics.median, "median"), stat(max, "max")]
    notes = [fit(n, width) for n in highlights(rows)]
    room = height - len(lines)
    # the spread rows sit right under the ranks' counters they summarise, the phase block
    # after them under its own header (issue 44: below "split" they read as phase times)
    phases = phase_rows(rows, width)
    if room >= len(phases) + len(spread_rows) + len(notes):
        return lines + spread_rows + phases + notes
    if room >= len(phases) + 1 + len(notes) and spread_rows:
        return lines + [spread_rows[1]] + phases + notes
    if room >= len(spread_rows) + len(notes):
        return lines + spread_rows + notes
    if spread_rows and room >= 1 + len(notes):
        return lines + [spread_rows[1]] + notes  # the median only
    tail = [fit("; ".join(notes), width)] if notes else []
    keep = [spread_rows[1]] if spread_rows and room > len(tail) else []
    return (lines + keep + tail)[:max(height, 1)]


class RankTable(TextLine):
    """Fed every rank's samples and events by the app; redrawn on its timer when changed."""

    DEFAULT_CSS = """
    RankTable {
        width: 1fr;
        height: 1fr;
        padding: 0 1;
        border: round $primary-background-lighten-2;
    }
    RankTable.-alert { border: heavy $error; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("ranks: waiting for the ranks' first steps…", id=id)
        self.rows: dict[int, RankRow] = {}
        self._dirty = False

    def on_mount(self) -> None:
        self.border_title = "ranks (min / median / max across ranks)"

    def _row_of(self, rank: int) -> RankRow:
        if rank not in self.rows:
            self.rows[rank] = RankRow(rank)
        return self.rows[rank]

    def push(self, sample: StepSample) -> None:
        row = self._row_of(sample.rank)
        row.last = sample
        row.recent_ms.append(sample.step_ms)
        row.recent.append(sample)
        self._dirty = True

    def set_leak(self, rank: int, counter: str | None) -> None:
        self._row_of(rank).leak = counter
        self._dirty = True

    def set_failed(self, rank: int, text: str) -> None:
        self._row_of(rank).failed = text
        self.set_class(True, "-alert")
        self._dirty = True

    def set_finished(self, rank: int) -> None:
        self._row_of(rank).finished = True
        self._dirty = True

    def refresh_view(self) -> None:
        if not self._dirty or not self.rows:
            return
        self._dirty = False
        width = max(20, self.content_size.width or 78)
        height = max(3, self.content_size.height or 12)
        text = "\n".join(rank_table_lines(list(self.rows.values()), width, height))
        self.set_text(text)

