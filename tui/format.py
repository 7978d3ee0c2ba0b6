"""Pure text helpers for the dashboard: values in units, the pane lines, the header and the
status line (the panes' own labels, notes and help are in the pane table, tui/panes.py).

Kept free of Textual and torch so they can be tested without an App and so the UI thread never
does more than string work on a refresh.
"""

from __future__ import annotations

import math

from probes.tools.units import (
    NA,
    format_bytes,
    format_clock,
    format_count,
    format_ms,
    format_rate,
)


def format_value(kind: str, value: float | None) -> str:
    """One value in human units; None -> n/a."""
    if value is None:
        return NA
    if kind == "bytes":
        return format_bytes(value)
    if kind == "rate":
        return format_rate(value)
    if kind == "ms":
        return format_ms(value)
    if kind == "scale":
        return format_scale(value)
    if kind == "loss":
        return f"{value:.4f}" if abs(value) < 1000 else f"{value:.4g}"
    return f"{value:g}"


def format_scale(scale: float | None) -> str:
    """GradScaler scale: 65536 as is, large ones as 2^k (scales are powers of two)."""
    if scale is None:
        return "no scaler"
    if scale > 0 and scale >= 1e6:
        exp = math.log2(scale)
        if exp == int(exp):
            return f"2^{int(exp)}"
        return f"{scale:.3g}"
    return f"{scale:g}"


def fit(text: str, width: int) -> str:
    """Cut text to width with an ellipsis (never wider than width)."""
    if width <= 0:
        return ""
    if len(text) <= width:
        return text
    return text[: max(0, width - 1)] + "…"


def fit_note(note: str, width: int) -> str:
    """A pane's note in ``width`` columns, its qualifiers giving way before its figures: a
    trailing "(…)", then what follows ": " or ", ", then " · " as a space; cut with "…" only
    when that is not enough ("workers 2 · +791 M" at 80 columns read as a number, user pass)."""
    text = note
    for shorter in (lambda t: t.rsplit(" (", 1)[0] if t.endswith(")") else t,
                    lambda t: t.split(": ", 1)[0],
                    lambda t: t.split(", ", 1)[0],
                    lambda t: t.replace(" · ", " ")):
        if len(text) <= width:
            return text
        text = shorter(text)
    return fit(text, width)


def fit_lines(text: str, width: int, max_lines: int) -> str:
    """Wrap ``text`` to ``width`` and keep at most ``max_lines`` lines, the last cut with "…"
    when anything was left out: a banner never loses its end silently (the full text is one
    key away, in the help or the event log)."""
    import textwrap

    if width <= 0 or max_lines <= 0:
        return ""
    lines: list[str] = []
    for para in text.split("\n"):
        lines += textwrap.wrap(para, width, break_long_words=True, break_on_hyphens=False) or [""]
    if len(lines) <= max_lines:
        return "\n".join(lines)
    kept = lines[:max_lines]
    kept[-1] = fit(kept[-1] + " …", width)  # ends with "…" whether or not it had room
    return "\n".join(kept)


def label_value_line(label: str, value: str, width: int, short_label: str | None = None) -> str:
    """'label        value' filling width exactly; the value wins when space is short."""
    if width <= 0:
        return ""
    if short_label is not None and len(label) + 1 + len(value) > width:
        label = short_label
    if len(value) >= width:
        return fit(value, width)
    room = width - len(value) - 1
    label = fit(label, room) if room > 0 else ""
    return label + " " * (width - len(label) - len(value)) + value


def range_text(kind: str, lo: float | None, hi: float | None, width: int) -> str:
    """min/max over the pane's window, in the longest form that fits width; a "min X max Y"
    form gives each value its unit ("min 99.7 max 201 MiB" read as 99.7 bytes)."""
    if lo is None or hi is None:
        return fit("min/max " + NA, width)
    a, b = format_value(kind, lo), format_value(kind, hi)
    a_num, _, a_unit = a.partition(" ")
    b_num, _, b_unit = b.partition(" ")
    candidates = [f"min {a}  max {b}", f"min {a} max {b}"]  # "min" and "max" each with a unit
    if a_unit and a_unit == b_unit:
        candidates += [f"{a_num}–{b_num} {b_unit}"]  # a range, its one unit after both
    candidates += [f"{a}–{b}"]
    for text in candidates:
        if len(text) <= width:
            return text
    return fit(candidates[-1], width)


def state_text(state: str, profile_phase: str | None, pause_requested: bool,
               quitting: bool) -> str:
    """running / paused / profiling / finished / stopped / interrupted / failed, plus the
    in-between states a key press causes."""
    if quitting:
        return "stopping" if state not in ("finished", "stopped", "interrupted", "failed") \
            else state
    if state == "running":
        if pause_requested:
            return "pausing"
        if profile_phase is not None:
            return "profiling"
    if state == "paused" and not pause_requested:
        return "resuming"
    return state


def amp_short_reason(amp: str, reason: str | None) -> str | None:
    """What the header says after the amp mode, the short part (before ";") of run_started's
    ``amp_reason`` (trainer.config.auto_amp / amp_reason), where it says more than the mode: an
    auto choice of fp32 ("auto: fp32, no native bf16"), a choice MEMTOP_CPU_BF16 made, bf16
    asked for where it is emulated."""
    if not reason:
        return None
    short = reason.split(";", 1)[0]
    if "MEMTOP_CPU_BF16" in short or short.endswith(", emulated"):
        return short
    if amp != "off" or not reason.startswith("auto:"):
        return None
    return short


def header_text(*, device_name: str, device_total: int | None, amp: str, batch: int | None,
                seq: int | None, params: int | None, step: int, elapsed_s: float | None,
                state: str, width: int, switches: str | None = None,
                amp_reason: str | None = None) -> str:
    """The header line; drops the least useful parts first when narrow: params, the memory
    total, the switches, the device, B/T; the amp mode and its reason stay as long as the
    step, clock and state fit beside them (README: the header says why auto chose fp32, at
    80 columns too). B/T are left out for a loop that did not say them; ``switches``: an
    inference run's eval/inference_mode/scaler; ``amp_reason``: run_started's, whose short
    part says why ``--amp auto`` chose fp32."""
    total = f" {format_bytes(device_total)}" if device_total else ""
    if total and str(device_name).upper().startswith("CPU"):
        total += " RAM"  # the host's memory, not a device's
    name = device_name or "…"
    why = amp_short_reason(amp, amp_reason)
    amp_part = f"amp {amp}" + (f" ({why})" if why else "")
    # narrow: an override's reason keeps its variable alone ("auto: fp32, MEMTOP_CPU_BF16=
    # emulated" -> "MEMTOP_CPU_BF16=emulated"), so B/T still fit at 80 columns
    terse = why.split(", ", 1)[-1] if why and "MEMTOP_CPU_BF16" in why else why
    amp_terse = f"amp {amp}" + (f" ({terse})" if terse else "")
    shape = [f"B{batch} T{seq}"] if batch and seq else []
    extra = [*shape, *([switches] if switches else [])]
    tail = [f"step {step}", format_clock(elapsed_s), state.upper()]
    params_part = [f"{format_count(params)} params"]
    variants = (
        [name + total, amp_part, *extra, *params_part, *tail],
        [name + total, amp_part, *extra, *tail],
        [name, amp_part, *extra, *tail],
        [name, amp_terse, *extra, *tail],
        [name, amp_part, *shape, *tail],  # an inference run's switches are fixed: they go first
        [amp_part, *shape, *tail],
        [name, amp_terse, *shape, *tail],
        [amp_terse, *shape, *tail],
        [name, amp_part, *tail],
        [amp_part, *tail],
    )
    for seps in (((" │ ", " memtop │ "), (" │ ", " "), (" · ", " ")), ((" ", ""),)):
        for parts in variants:
            for sep, lead in seps:
                text = lead + sep.join(parts)
                if len(text) <= width:
                    return text
    return fit(" ".join(tail), width)


def profile_text(phase: str | None, requested: bool, available: bool,
                 done_window: str | None = None) -> str:
    """The profiler part of the status line; ``done_window``: the last window whose table
    came, named by its traced steps (its top ops are on screen: "off" alone read as if none
    had run)."""
    return window_text("profiler", phase, requested, available,
                       f"done, {done_window}" if done_window is not None else None)


def window_text(label: str, phase: str | None, requested: bool, available: bool,
                done: str | None) -> str:
    """A window's part of the status line (the profiler's, the memory window's): "n/a" where
    the run has none, else its phase, "requested", what its last one did, or "off"."""
    if not available:
        return f"{label}: n/a"
    if phase is not None:
        return f"{label}: {phase}"
    if requested:
        return f"{label}: requested"
    return f"{label}: {done if done is not None else 'off'}"


def leak_demo_text(kind: str | None, active: bool, since: int | None, toggling: bool,
                   available: bool = True) -> str:
    if not available and not active:
        return "leak demo: n/a"
    if toggling:
        return "leak demo: switching…"
    if active:
        return f"leak demo: {kind} since step {since}" if since else f"leak demo: {kind}"
    return "leak demo: off"


# the footer's shorter words, for a row of keys that does not fit (the help has them in full)
FOOTER_SHORT = {"profile": "prof", "report": "rep", "who holds": "who", "stop run": "stop",
                "modules": "mod"}


def footer_width(keys: list[tuple[str, str]]) -> int:
    """Columns of a compact footer row: "key description" per key, one column between keys."""
    return sum(len(k) + (1 + len(d) if d else 0) for k, d in keys) + max(0, len(keys) - 1)


def footer_descriptions(keys: list[tuple[str, str]], width: int) -> list[str]:
    """Each key's description so the row fits ``width``: the full words, else the short ones
    (FOOTER_SHORT), else the longest cut with "…" one column at a time; a key itself is never
    cut, so no label ends mid-word without the mark ("q q" at 80 columns, issue 30)."""
    descs = [d for _, d in keys]
    if footer_width(keys) <= width:
        return descs
    descs = [FOOTER_SHORT.get(d, d) for d in descs]
    while footer_width(list(zip([k for k, _ in keys], descs, strict=True))) > width:
        longest = max(range(len(descs)), key=lambda i: len(descs[i]))
        if len(descs[longest]) <= 1:
            break  # the keys alone are wider: nothing left to cut
        descs[longest] = fit(descs[longest], len(descs[longest]) - 1)
    return descs
