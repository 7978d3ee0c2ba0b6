"""Hardware and software facts for the report: why is today's number different?
(docs/ARCHITECTURE.md, the method).

``system_info(device)`` runs on the training thread at run start and goes into the run_started
event, so a report made later, on another machine, still describes the machine that trained.
``host_info()`` never imports torch: the report falls back to it for runs recorded without it.
"""

from __future__ import annotations

import os
import platform
import re
import sys
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
        text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text("utf-8")
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


def system_info(device: Any = None) -> dict[str, Any]:
    """host_info plus what torch knows: CUDA/cuDNN versions and the GPU, when ``device`` is one.

    Call it on the training thread (it may initialise CUDA); it never raises.
    """
    info = host_info()
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda
        info["cudnn"] = (torch.backends.cudnn.version()
                         if torch.backends.cudnn.is_available() else None)
        info["num_threads"] = torch.get_num_threads()
        dev = torch.device(device) if device is not None else None
        if dev is not None and dev.type == "cuda" and torch.cuda.is_available():
            props = torch.cuda.get_device_properties(dev)
            info["gpu_name"] = props.name
            info["gpu_memory_bytes"] = int(props.total_memory)
            info["gpu_capability"] = f"{props.major}.{props.minor}"
            info["gpu_count"] = torch.cuda.device_count()
    except Exception as exc:  # a report field is never worth a failed run
        info["torch_error"] = f"{type(exc).__name__}: {exc}"
    info["source"] = "run start"
    return info
