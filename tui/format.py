"""Pure text helpers for the dashboard: every string a widget shows is built here.

Kept free of Textual and torch so they can be tested without an App and so the UI thread never
does more than string work on a refresh.
"""

from __future__ import annotations

import math
from typing import Any

from probes.tools.units import (
    NA,
    format_bytes,
    format_clock,
    format_count,
    format_ms,
    format_rate,
)

# Pane ids in display order, and what kind of value each holds.
PANE_KINDS: dict[str, str] = {
    "allocated": "bytes",
    "reserved": "bytes",
    "peak": "bytes",
    "driver": "bytes",
    "scale": "scale",
    "tokens": "rate",
    "step_ms": "ms",
    "loss": "loss",
}

# Labels say what the counter really is on each device (docs/ARCHITECTURE.md: counters table).
_CPU_LABELS = {
    "allocated": "heap in use",
    "reserved": "heap held",
    "peak": "peak heap (sampled)",
    "driver": "RSS",
}
_CUDA_LABELS = {
    "allocated": "allocated",
    "reserved": "reserved",
    "peak": "peak allocated",
    "driver": "NVML used",
}
_COMMON_LABELS = {"scale": "grad scale", "tokens": "tokens/s", "step_ms": "step time",
                  "loss": "loss"}


_SHORT_LABELS = {
    "cpu": {"allocated": "heap used", "reserved": "heap held", "peak": "peak (s)",
            "driver": "RSS"},
    "cuda": {"allocated": "alloc", "reserved": "reserved", "peak": "peak", "driver": "NVML"},
    "common": {"scale": "scale", "tokens": "tok/s", "step_ms": "step", "loss": "loss"},
}


def pane_labels(device_type: str, short: bool = False) -> dict[str, str]:
    """Pane id -> label; CPU counters are named for what glibc and /proc report.

    Short labels fit a 20-column pane at 80×24 ("(s)" = sampled, explained in the help).
    """
    if short:
        labels = dict(_SHORT_LABELS["cuda" if device_type == "cuda" else "cpu"])
        labels.update(_SHORT_LABELS["common"])
        return labels
    labels = dict(_CUDA_LABELS if device_type == "cuda" else _CPU_LABELS)
    labels.update(_COMMON_LABELS)
    return labels


def throughput(sample: Any) -> float | None:
    """tokens/s when the loop counts tokens, else samples/s, else steps/s."""
    if sample.tokens_per_s is not None:
        return sample.tokens_per_s
    if getattr(sample, "samples_per_s", None) is not None:
        return sample.samples_per_s
    return 1000.0 / sample.step_ms if sample.step_ms else None


def throughput_label(sample: Any) -> str:
    """The throughput pane's label for what :func:`throughput` shows."""
    if sample.tokens_per_s is not None:
        return _COMMON_LABELS["tokens"]
    return "samples/s" if getattr(sample, "samples_per_s", None) is not None else "steps/s"


def sample_values(sample: Any) -> dict[str, float | None]:
    """The value each pane shows for one StepSample (None -> n/a)."""
    return {
        "allocated": sample.allocated_bytes,
        "reserved": sample.reserved_bytes,
        "peak": sample.peak_allocated_bytes,
        "driver": sample.driver_used_bytes,
        "scale": sample.scale,
        "tokens": throughput(sample),
        "step_ms": sample.step_ms,
        "loss": _finite_or_none(sample.loss),
    }


def cuda_notes(sample: Any) -> dict[str, str | None]:
    """The CUDA-only figures under the reserved and driver panes (None on CPU): the cache's free
    bytes with cudaMalloc retries, and NVML − reserved (context and libraries, probes/cudamem)."""
    if not str(getattr(sample, "device", "")).startswith("cuda"):
        return {"reserved": None, "driver": None}
    alloc, resv = sample.allocated_bytes, sample.reserved_bytes
    cache = None
    if alloc is not None and resv is not None:
        retries = getattr(sample, "alloc_retries", None)
        cache = f"cache free {format_bytes(max(0, resv - alloc))}" + (
            f", {retries} malloc retries" if retries else "")
    driver = None
    if sample.driver_used_bytes is not None and resv is not None:
        driver = f"ctx+libs {format_bytes(sample.driver_used_bytes - resv)} (NVML − reserved)"
    return {"reserved": cache, "driver": driver}


def _finite_or_none(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return x


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
    """min/max over the pane's window, in the longest form that fits width."""
    if lo is None or hi is None:
        return fit("min/max " + NA, width)
    a, b = format_value(kind, lo), format_value(kind, hi)
    a_num, _, a_unit = a.partition(" ")
    b_num, _, b_unit = b.partition(" ")
    candidates = [f"min {a}  max {b}", f"min {a} max {b}"]
    if a_unit and a_unit == b_unit:
        candidates += [f"min {a_num} max {b_num} {b_unit}", f"{a_num}–{b_num} {b_unit}"]
    candidates += [f"{a}–{b}"]
    for text in candidates:
        if len(text) <= width:
            return text
    return fit(candidates[-1], width)


def state_text(state: str, profile_phase: str | None, pause_requested: bool,
               quitting: bool) -> str:
    """running / paused / profiling / stopped, plus the in-between states a key press causes."""
    if quitting:
        return "stopping" if state not in ("stopped", "failed") else state
    if state == "running":
        if pause_requested:
            return "pausing"
        if profile_phase is not None:
            return "profiling"
    if state == "paused" and not pause_requested:
        return "resuming"
    return state


def header_text(*, device_name: str, device_total: int | None, amp: str, batch: int | None,
                seq: int | None, params: int | None, step: int, elapsed_s: float | None,
                state: str, width: int, switches: str | None = None) -> str:
    """The header line; drops the least useful parts first when narrow. B/T are left out for
    a loop that did not say them; ``switches``: an inference run's eval/inference_mode/scaler."""
    total = f" {format_bytes(device_total)}" if device_total else ""
    device = f"{device_name or '…'}{total}"
    shape = [f"B{batch} T{seq}"] if batch and seq else []
    parts = [device, f"amp {amp}", *shape, *([switches] if switches else []),
             f"{format_count(params)} params",
             f"step {step}", format_clock(elapsed_s), state.upper()]
    for sep, lead in ((" │ ", " memtop │ "), (" │ ", " "), (" · ", " "), (" ", "")):
        text = lead + sep.join(parts)
        if len(text) <= width:
            return text
    return fit(" ".join(parts[3:] if len(parts) > 3 else parts), width)


def profile_text(phase: str | None, requested: bool, available: bool) -> str:
    """The profiler part of the status line."""
    if not available:
        return "profiler: n/a"
    if phase is not None:
        return f"profiler: {phase}"
    if requested:
        return "profiler: requested"
    return "profiler: off"


def leak_demo_text(kind: str | None, active: bool, since: int | None, toggling: bool,
                   available: bool = True) -> str:
    if not available and not active:
        return "leak demo: n/a"
    if toggling:
        return "leak demo: switching…"
    if active:
        return f"leak demo: {kind} since step {since}" if since else f"leak demo: {kind}"
    return "leak demo: off"
