"""Human units, each formatter defined once for the whole project (dashboard, headless lines,
reports, comparisons): bytes, rates, milliseconds, microseconds, durations, clocks, counts; and
parsing sizes such as ``6GiB``. None always reads as ``na`` ("n/a" unless a table wants "-")."""

from __future__ import annotations

import math
import re

NA = "n/a"

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Parse "6GiB", "512MiB", "1.5GB" or a plain byte count; ValueError with a plain sentence."""
    match = _SIZE_RE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise ValueError(f"cannot read {text!r} as a size; use a number with a unit such as 6GiB")
    value = float(match.group(1)) * _SIZE_UNITS[unit]
    if value <= 0:
        raise ValueError(f"size {text!r} must be greater than zero")
    return int(value)


def format_bytes(n: float | None, na: str = "n/a") -> str:
    """1536 -> '1.5 KiB'. Binary units, as the allocator counts."""
    if n is None:
        return na
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            if unit == "B":
                return f"{sign}{int(n)} B"
            return f"{sign}{n:.1f} {unit}" if n < 100 else f"{sign}{n:.0f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_rate(n: float | None, unit: str = "", na: str = "n/a") -> str:
    """12345 -> '12.3k'; for tokens/s and similar."""
    if n is None:
        return na
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.1f}{suffix}{unit}"
    return f"{n:.0f}{unit}" if abs(n) >= 10 else f"{n:.2f}{unit}"


def format_ms(ms: float | None, digits: int | None = None, na: str = NA) -> str:
    """Milliseconds: 0.12 ms, 12.3 ms, 123 ms, 12.3 s; ``digits`` fixes the decimals (12.30 ms)
    where a column of figures must line up."""
    if ms is None:
        return na
    if digits is not None:
        return f"{ms:.{digits}f} ms"
    if ms >= 10_000:
        return f"{ms / 1000:.1f} s"
    if ms >= 100:
        return f"{ms:.0f} ms"
    return f"{ms:.1f} ms" if ms >= 1 else f"{ms:.2f} ms"


def format_pct(ratio: float | None, na: str = NA) -> str:
    """A share as a percentage: 0.123 -> '12.3%'."""
    return na if ratio is None else f"{ratio * 100:.1f}%"


def format_us(us: float | None, na: str = NA) -> str:
    """Profiler microseconds in the unit that reads best: 850 µs, 1.25 ms, 2.10 s."""
    if us is None:
        return na
    if us >= 1_000_000:
        return f"{us / 1e6:.2f} s"
    if us >= 1000:
        return f"{us / 1000:.2f} ms"
    return f"{us:.0f} µs"


def format_count(n: float | None) -> str:
    """Parameter counts: 804224 -> 0.80M."""
    if n is None:
        return NA
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e5:
        return f"{n / 1e6:.2f}M"
    if n >= 1e3:
        return f"{n / 1e3:.1f}k"
    return str(int(n))


def format_estimate(n: float | None, na: str = NA) -> str:
    """An estimate to two significant figures, with the "about" that says so: 31032 ->
    'about 31,000' (a count derived from a budget is not precise to the unit)."""
    if n is None:
        return na
    if abs(n) < 100:  # small counts are exact
        return f"{n:.0f}"
    digits = len(str(int(abs(n)))) - 2
    return f"about {round(n, -digits):,.0f}"


def format_steps(n: float | None) -> str:
    """Step counts: 950, 12.5k, 1.2M."""
    if n is None:
        return NA
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    if n >= 1e4:
        return f"{n / 1e3:.0f}k"
    return f"{int(n)}"


def format_clock(seconds: float | None) -> str:
    """Elapsed time as H:MM:SS (M:SS under an hour)."""
    if seconds is None or seconds < 0 or not math.isfinite(seconds):
        return NA
    s = int(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def format_duration(seconds: float | None) -> str:
    """A span of seconds: 0.45 s, 45 s, 12 min, 3 h 10 min, 2.5 days (rougher as it grows)."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return NA
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400:
        h, rem = divmod(int(seconds), 3600)
        return f"{h} h {rem // 60} min"
    return f"{seconds / 86400:.1f} days"


def format_reading(value: float | None, unit: str, na: str = NA) -> str:
    """A device reading in whole units (issue 26's GPU busy figures): 212 W, 1980 MHz, 71 °C,
    87% (``unit`` "%" is a percentage already, not a share)."""
    if value is None:
        return na
    return f"{value:.0f}%" if unit == "%" else f"{value:.0f} {unit}"
