"""Shared by the benchmark scripts: machine description, medians, appending to RESULTS.md."""

from __future__ import annotations

import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def machine() -> str:
    """One line: CPU model, cores, RAM, Python, torch — the context every figure needs."""
    import torch

    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{cpu}, {os.cpu_count()} cores, {ram:.0f} GiB RAM, {gpu}; Python "
            f"{platform.python_version()}, torch {torch.__version__}")


def median(values: list[float]) -> float:
    return statistics.median(values)


def in_thread(fn, *args):
    """Run torch work on a non-main thread, as memtop's trainer does (docs/ARCHITECTURE.md)."""
    box: dict = {}

    def target() -> None:
        try:
            box["v"] = fn(*args)
        except BaseException as exc:
            box["e"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "e" in box:
        raise box["e"]
    return box["v"]


def append_results(title: str, body: str) -> None:
    """Append one dated section to RESULTS.md (sections are never rewritten)."""
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = f"\n## {title} ({stamp})\n\nMachine: {machine()}\n\n{body.strip()}\n"
    with open(RESULTS, "a", encoding="utf-8") as fh:
        fh.write(text)
    print(f"appended to {RESULTS}")
