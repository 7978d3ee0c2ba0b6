"""Text for the panels under the panes: leak alerts, the top-ops table, the ledger, the chart.

Pure functions, like tui/format.py (the pane, header and status-line text) and tui/panes.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from probes import records as R
from probes.records import finite_num, incomplete
from probes.tools.units import (
    format_bytes,
    format_ms,
    format_rate,
    format_us,
)
from tui.format import fit

# ---- leak alerts ----------------------------------------------------------------------------

COUNTER_LABELS, _COUNTER_SHORT = R.LEAK_COUNTER_NAMES, R.LEAK_COUNTER_SHORT


COMPACT_WIDTH = 72  # an 80-column banner's line (78) less its "LEAK: "


def leak_alert_line(data: dict[str, Any], step: int, compact: bool = False,
                    room: int = COMPACT_WIDTH, when: str | None = None) -> str:
    """One alert as a sentence: what grows, how fast, since when, and how long until full.

    ``compact`` keeps it to one 80-column line so the hint below it gets the room; an alert row
    without its counter, rate or start reads "incomplete event (no ...)". ``when`` says which
    forecast the time to full is ("now": the latest, recomputed every few seconds; the report
    gives the one at the alert and says so), added where it fits.
    """
    text = _alert_line(data, step, compact, room)
    if when and R.fill_text(data) is not None:
        tail = f" ({when})"
        if not compact or len(text + tail) <= room:
            text += tail
    return text


def _alert_line(data: dict[str, Any], step: int, compact: bool, room: int) -> str:
    missing = incomplete(R.LEAK_SUSPECTED, data)
    if missing is not None:
        return f"leak suspected at step {step}: {missing}"
    key = str(data.get("counter", ""))
    if key == R.WORKERS_COUNTER:  # "DataLoader workers: +4 MiB/step between 2 workers, ..."
        text = R.workers_leak_text(data)
        left = R.fill_text(data, short=compact)
        whole = f"{text}; {left}" if left else text
        return whole if not compact or len(whole) <= room else text
    counter = (_COUNTER_SHORT if compact else COUNTER_LABELS).get(key, key)
    rate = format_bytes(data.get("bytes_per_step"))
    since = data.get("since_step", step)
    left = R.fill_text(data, short=compact)
    fill_rate, leak_rate = finite_num(data.get("fill_bytes_per_step")), \
        finite_num(data.get("bytes_per_step"))
    if compact and left and " fills " in left and fill_rate and leak_rate \
            and fill_rate >= 2 * leak_rate:
        # what fills the memory grows far faster than what leaks (a fragmented heap: RSS
        # several MiB a step beside 150 KiB of held objects): say both rates in 78 columns
        counter = counter.removeprefix("host ")
        fill, rest = left.split(" fills ", 1)
        tail = f"{fill} +{format_bytes(fill_rate)}/step fills {rest}"
        text = f"{counter} +{rate}/step since {since}; {tail}"
        return text if len(text) <= room else f"{counter} +{rate}/step; {tail}"
    if compact:
        text = f"{counter} +{rate}/step since step {since}"
    else:
        text = f"{counter} grows {rate}/step since step {since}"
    if left is None:
        return text
    return f"{text}; {left}"


GLIBC_KEEPS = "glibc keeps freed memory for reuse, it does not hand it back to the OS"


def leak_cleared_text(data: dict[str, Any], step: int) -> str:
    """"LEAK CLEARED", and why RSS may stay up: the heap fell, the pages stay with malloc."""
    counter = str(data.get("counter", ""))
    label = COUNTER_LABELS.get(counter, counter)
    text = f"LEAK CLEARED: {label} is flat again (step {step})"
    rss, before = data.get("host_rss_bytes"), data.get("alert_rss_bytes")
    if counter.startswith("host") and isinstance(rss, int) and (
            not isinstance(before, int) or rss >= 0.9 * before):
        text += f"; host RSS stays at {format_bytes(rss)}: {GLIBC_KEEPS}"
    return text


def leak_banner_text(alerts: dict[str, dict[str, Any]], compact: bool = False,
                     room: int = COMPACT_WIDTH, when: str | None = None) -> tuple[str, str]:
    """(headline lines, hint) for the active alerts, newest last; ``room``: a compact line's
    columns; ``when``: which forecast the times to full are (leak_alert_line)."""
    lines = [leak_alert_line(d, d.get("_step", 0), compact, room, when) for d in alerts.values()]
    hint = next((d.get("hint") for d in reversed(list(alerts.values())) if d.get("hint")), "")
    return "\n".join(lines), hint or ""


# ---- top-ops table --------------------------------------------------------------------------

# (key in the event row, column title, kind)
OP_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("calls", "calls", "count"),
    ("self_cpu_us", "self CPU", "us"),
    ("cpu_total_us", "CPU total", "us"),
    ("self_device_us", "self dev", "us"),
    ("device_total_us", "dev total", "us"),
    ("cpu_memory_bytes", "CPU mem", "bytes"),
    ("device_memory_bytes", "dev mem", "bytes"),
)
_OP_TITLES = {key: title for key, title, _ in OP_COLUMNS}
_OP_KINDS = {key: kind for key, _, kind in OP_COLUMNS}

_OP_PREFIXES = (
    ("autograd::engine::evaluate_function: ", "bwd: "),
    ("Optimizer.step#", "optim "),
    ("Optimizer.zero_grad#", "zero_grad "),
)


def op_columns(top_ops: Sequence[dict[str, Any]]) -> list[str]:
    """The numeric columns that have at least one measured value (device columns on CUDA only)."""
    return [key for key, _, _ in OP_COLUMNS
            if any(op.get(key) is not None for op in top_ops)]


def op_column_title(key: str) -> str:
    return _OP_TITLES.get(key, key)


def default_sort_key(sort_by: str | None, columns: Sequence[str]) -> str:
    """Device total on CUDA, CPU total on CPU (the tutorial's cuda/cpu_time_total)."""
    preferred = "device_total_us" if sort_by == "device" else "cpu_total_us"
    for key in (preferred, "cpu_total_us", "self_cpu_us"):
        if key in columns:
            return key
    return columns[0] if columns else "cpu_total_us"


def next_sort_key(current: str, columns: Sequence[str]) -> str:
    """The column after ``current`` (wrapping); what the `o` key steps through."""
    if not columns:
        return current
    if current not in columns:
        return columns[0]
    return columns[(columns.index(current) + 1) % len(columns)]


def sort_ops(top_ops: Iterable[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Largest first; rows without the value go last. Ranges (record_function spans such as
    ProfilerStep*, forward, backward) come after every op: a span's total holds its ops', so
    by a total it topped the table and a short box showed nothing else."""
    ops = list(top_ops)
    return sorted(ops, key=lambda op: (op.get("user_annotation") is True, op.get(key) is None,
                                       -(op.get(key) or 0)))


def shorten_op(name: str, width: int) -> str:
    """Shorten long op names: known prefixes first, then an ellipsis in the middle."""
    for long, short in _OP_PREFIXES:
        if name.startswith(long) and len(name) > width:
            name = short + name[len(long):]
    if len(name) <= width:
        return name
    if width <= 3:
        return name[:width]
    head = (width - 1) * 2 // 3
    tail = width - 1 - head
    return name[:head] + "…" + (name[-tail:] if tail else "")


def op_cell(key: str, value: Any) -> str:
    kind = _OP_KINDS.get(key, "")
    if value is None:
        return "-"
    if kind == "us":
        return format_us(value)
    if kind == "bytes":
        return format_bytes(value)
    return str(value)


OP_COLUMN_CELLS = 10  # a numeric column's cells, its gap included
OP_NAME_MIN = 24  # an op name keeps this many cells: "aten::ma…dices" at 12 read as nothing


def op_name_width(total_width: int, n_columns: int) -> int:
    """Room left for the op name after the numeric columns."""
    return max(12, min(60, total_width - OP_COLUMN_CELLS * n_columns - 4))


def visible_op_columns(columns: Sequence[str], sort_key: str, total_width: int) -> list[str]:
    """The numeric columns that fit beside an op name of OP_NAME_MIN cells: the sort column
    always, then the others in their order; what is left out shows again with width (or as
    the sort column, `o`)."""
    room = max(0, (total_width - 4 - OP_NAME_MIN) // OP_COLUMN_CELLS)
    keep = [c for c in columns if c == sort_key][:1]
    for column in columns:
        if len(keep) >= max(1, room):
            break
        if column not in keep:
            keep.append(column)
    return [c for c in columns if c in keep]


# ---- ledger ---------------------------------------------------------------------------------

def ops_title(what: str, window: str, sort_title: str, hidden: int, width: int) -> str:
    """The top-ops box's title in ``width`` columns, giving way from its end and never cut
    mid-word (at 100 columns it read "… · +2 col…", issue 38): the sort key's "(o)" goes (the
    footer has it), then "if wider", then "by <sort>" (its column's ▼ says it) before the
    hint that columns are hidden; what the table is and which window stay."""
    head = f"{what} · {window}"
    by = f" · by {sort_title}"
    cols = f" · +{hidden} col{'s' * (hidden > 1)}" if hidden else ""
    tails = ([by + " (o)" + cols + " if wider", by + cols + " if wider", by + cols, cols, by]
             if hidden else [by + " (o)", by])
    for tail in tails:
        if len(head + tail) <= width:
            return head + tail
    return fit(head, width)


def ledger_rows(data: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(name, measured, predicted, formula or note) per ledger line."""
    rows = []
    for line in data.get("lines", []) or []:
        note = line.get("formula") or line.get("note") or ""
        rows.append((str(line.get("name", "?")), format_bytes(line.get("measured_bytes")),
                     format_bytes(line.get("predicted_bytes"), na="-"), str(note)))
    return rows


def ledger_footer(data: dict[str, Any]) -> str:
    """Below the lines: "tensors" sums the exact tensor lines alive at the snapshot (params,
    optimizer state, weight copies, activations; not the gradients, which do not exist at the
    end of forward), not the heap/other/cache lines, so it is not the column's total."""
    alive = data.get("tensors_at_snapshot_bytes")
    if alive is None:  # a run recorded before the ledger said it
        alive = data.get("total_measured_bytes")
    dev = str(data.get("device") or "cpu")
    return (f"tensors {format_bytes(alive)} · {R.counter_name('allocated', dev)} "
            f"{format_bytes(data.get('allocated_bytes'))} · {R.counter_name('reserved', dev)} "
            f"{format_bytes(data.get('reserved_bytes'))} · step {data.get('sampled_step', '?')}, "
            f"at {R.LEDGER_MOMENT} (panes: {R.PANE_MOMENT})")


# ---- chart ----------------------------------------------------------------------------------

def downsample_max(values: Sequence[float], n: int) -> list[float]:
    """At most n points, each the max of its bucket (a spike must not vanish from the chart)."""
    if n <= 0:
        return []
    if len(values) <= n:
        return list(values)
    out = []
    size = len(values) / n
    for i in range(n):
        lo, hi = int(i * size), int((i + 1) * size)
        out.append(max(values[lo:max(hi, lo + 1)]))
    return out


def byte_unit(max_bytes: float) -> tuple[str, float]:
    """The unit the chart's y axis uses for values up to max_bytes."""
    for unit, div in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if max_bytes >= div:
            return unit, float(div)
    return "B", 1.0


# ---- the baseline line ----------------------------------------------------------------------
def baseline_text(name: str, base: dict[str, Any], now: dict[str, Any],
                  change: dict[str, Any], width: int = 80) -> str:
    """'vs baseline NAME: tok/s 4.3k (+27%) │ step p50 14.8 ms (-22%) │ peak 112 MiB (-1%)'.

    Before the first measured step the baseline's own figures are shown instead."""
    fmt = {"tokens_per_s": ("tok/s", format_rate), "step_ms": ("step p50", format_ms),
           "peak_allocated_bytes": ("peak", format_bytes)}
    parts = []
    for key, (label, f) in fmt.items():
        if now.get(key) is None:
            parts.append(f"{label} {f(base.get(key))} (base)")
        elif change.get(key) is None:
            parts.append(f"{label} {f(now[key])}")
        else:
            parts.append(f"{label} {f(now[key])} ({change[key] * 100:+.0f}%)")
    return fit(f"vs baseline {name}: " + " │ ".join(parts), width)
