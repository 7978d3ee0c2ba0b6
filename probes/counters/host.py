"""The host's facts without torch: CPU, RAM, OS, Python and package versions, memtop's own version,
and this process's RSS. The report and `memtop --version` read them; probes/counters/sysinfo.py adds
torch's."""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "hardware", "processor\t: ")):
                    value = line.split(":", 1)[1].strip()
                    if value and not value.isdigit():
                        return value
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # x86 ones; aarch64's "bf16"


def cpu_flags(cpuinfo: str) -> set[str]:
    """The feature flags of /proc/cpuinfo's first processor ("flags" on x86, "Features" on
    aarch64); empty when not listed."""
    for line in cpuinfo.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


CPU_BF16_ENV = "MEMTOP_CPU_BF16"  # native | emulated: overrides the CPU flags' bf16 answer
CPU_BF16_VALUES = ("native", "emulated")


def cpu_bf16_override(environ: Mapping[str, str] | None = None) -> str | None:
    """``MEMTOP_CPU_BF16``'s value, ``native`` or ``emulated``, or None when unset or empty.

    It stands in for the CPU's own flags where they mislead (a VM that hides avx512_bf16) and in
    tests, so one machine runs both the bf16 and the fp32 path. Any other value is a ValueError
    with a plain sentence (the CLI's exit 2)."""
    raw = (os.environ if environ is None else environ).get(CPU_BF16_ENV, "")
    value = raw.strip().lower()
    if not value:
        return None
    if value not in CPU_BF16_VALUES:
        raise ValueError(f"{CPU_BF16_ENV}={raw!r} is not one of {', '.join(CPU_BF16_VALUES)} "
                         "(or unset, to read the CPU's flags)")
    return value


def bf16_emulated_why(flags: set[str], override: str | None = None) -> str | None:
    """Why bf16 is emulated on this CPU (each bf16 matmul converted to fp32 and back), or None:
    native, or the flags unknown (no guess). ``override``: ``cpu_bf16_override()``'s value."""
    if override == "native":
        return None
    if override == "emulated":
        return f"{CPU_BF16_ENV}=emulated says bf16 is not native here"
    if not flags or flags & NATIVE_BF16_FLAGS:
        return None
    best = "avx512f" if "avx512f" in flags else ("avx2" if "avx2" in flags else "no avx2")
    return f"this CPU has {best} but neither avx512_bf16 nor amx_bf16"


def read_cpu_flags() -> set[str]:
    """This machine's CPU flags; empty where /proc/cpuinfo cannot be read (not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            return cpu_flags(fh.read())
    except OSError:
        return set()


def host_ram_bytes() -> int | None:
    """Physical RAM of this machine (MemTotal), or None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def host_available_bytes() -> int | None:
    """RAM the kernel can still hand out without swapping (MemAvailable), for every process
    of the host together: what a growing run (or several ranks on one host) will fill."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def memtop_version() -> str:
    """Installed version, else the version in the source tree's pyproject.toml."""
    found = _version("memtop")
    if found:
        return found
    try:
        text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text("utf-8")
        match = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
        if match:
            return match.group(1) + " (source tree)"
    except OSError:
        pass
    return "unknown"


def host_info() -> dict[str, Any]:
    """CPU, RAM, OS, Python and package versions; cheap and torch-free."""
    torch_mod = sys.modules.get("torch")
    return {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "ram_bytes": host_ram_bytes(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": getattr(torch_mod, "__version__", None) or _version("torch"),
        "numpy": _version("numpy"),
        "memtop": memtop_version(),
    }


def peak_rss_bytes() -> int | None:
    """This process's resident-set high-water mark (VmHWM in /proc/self/status): a true peak,
    unlike RSS read at a step's end; None where it cannot be read (not Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def reset_peak_rss() -> bool:
    """Start VmHWM over from the RSS now (``5`` into /proc/self/clear_refs, Linux 4.0+), so the
    next read is the peak of what ran since. False where the kernel refuses it (an older
    kernel, a sandbox): the caller then has no true peak and must say so."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError:
        return False
    return True


class RssReader:
    """Process RSS from /proc/self/statm, keeping the file open so a read is one pread."""

    def __init__(self) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        try:
            self._fd: int | None = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._fd = None

    def read(self) -> int | None:
        if self._fd is None:
            return None
        try:
            fields = os.pread(self._fd, 128, 0).split()
            return int(fields[1]) * self._page
        except (OSError, IndexError, ValueError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
