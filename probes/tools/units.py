"""Human units: bytes and rates, and parsing sizes such as ``6GiB``."""

from __future__ import annotations

import re

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
