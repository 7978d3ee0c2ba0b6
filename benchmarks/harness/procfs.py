"""What else ran, read from /proc: the CPU of a process or of its threads, its RSS (split into
RssAnon and RssFile), the machine's load, waiting for quiet cores, and the CPU other processes
used over an interval. On 2 cores a second torch process makes training ~30× slower (OpenMP's
barriers), so a figure measured while others used ≳0.3 cores is marked, not judged."""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import threading
import time


def _clock_ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def _stat_line() -> list[int]:
    with open("/proc/stat", encoding="ascii") as fh:
        return [int(v) for v in fh.readline().split()[1:]]


def cpu_busy_s() -> float:
    """CPU seconds all cores have spent busy since boot (/proc/stat)."""
    vals = _stat_line()
    return (sum(vals) - vals[3] - vals[4]) / _clock_ticks()


def proc_cpu_s(pid: int, tid: int | None = None) -> float | None:
    """utime + stime of a process (or one of its threads) in seconds; None when it is gone."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _clock_ticks()
    except (OSError, IndexError, ValueError):
        return None


def own_cpu_s(pid: int | None = None) -> float:
    """utime + stime of a process (this one by default), children excluded, in seconds."""
    return proc_cpu_s(pid or os.getpid()) or 0.0


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds of each Python thread of this process, by thread name (the OS name of a
    thread is "python" on 3.11, so the kernel's per-task figures are matched to threading's
    names by native id)."""
    out: dict[str, float] = {}
    for t in threading.enumerate():
        with contextlib.suppress(TypeError):
            cpu = proc_cpu_s(os.getpid(), t.native_id)
            if cpu is not None:
                out[t.name] = out.get(t.name, 0.0) + cpu
    return out


def proc_rss_bytes(pid: int, field: str = "VmRSS") -> int | None:
    """VmRSS of a process from /proc/PID/status, or another of its kB fields (RssAnon: private
    memory; RssFile: file pages mapped in, such as a library's code read on first use)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def load_avg() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def busy_cores(interval_s: float = 3.0) -> float:
    """How many cores were busy over the next interval_s (from /proc/stat): an instant load."""
    def snap() -> tuple[int, int]:
        vals = _stat_line()
        return sum(vals), vals[3] + vals[4]  # total, idle + iowait

    t1, i1 = snap()
    time.sleep(interval_s)
    t2, i2 = snap()
    return (os.cpu_count() or 1) * (1 - (i2 - i1) / max(1, t2 - t1))


def top_cpu() -> str:
    """The busiest process right now (what loads the shared cores), one short string."""
    try:
        out = subprocess.run(["ps", "-eo", "pcpu,pid,args", "--sort=-pcpu"],
                             capture_output=True, text=True, timeout=5).stdout.splitlines()
        return out[1].strip()[:100] if len(out) > 1 else "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def wait_quiet(max_busy: float, max_wait_s: float, label: str = "") -> float:
    """Wait (up to max_wait_s) until under max_busy cores are busy (others' benchmarks: on 2
    cores a second torch process makes training ~30x slower through OpenMP's barriers)."""
    t0 = time.monotonic()
    while True:
        busy = busy_cores()
        if busy <= max_busy or time.monotonic() - t0 > max_wait_s:
            if busy > max_busy:
                print(f"  still {busy:.2f} cores busy {label}; measuring anyway", flush=True)
            return busy
        print(f"  {busy:.2f} cores busy {label}: waiting (top: {top_cpu()})", flush=True)
        time.sleep(15)


def _children_cpu_s() -> float:
    """CPU of this process's waited-for children (subprocess runs, tmux-less sides)."""
    t = os.times()
    return t.children_user + t.children_system


class LoadMeter:
    """CPU that processes other than ours used over an interval, in cores: a figure measured
    while others used ≳0.3 cores is not comparable (OpenMP barriers on 2 cores)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.busy0 = cpu_busy_s()
        self.own0 = own_cpu_s() + _children_cpu_s()

    def others_cores(self) -> float:
        wall = max(1e-9, time.perf_counter() - self.t0)
        own = own_cpu_s() + _children_cpu_s() - self.own0
        return max(0.0, (cpu_busy_s() - self.busy0 - own) / wall)


def load_note(others: list[float], max_busy: float) -> str:
    """The sentence every ratio section carries about what else ran."""
    worst = max(others) if others else 0.0
    mean = statistics.fmean(others) if others else 0.0
    state = ("quiet machine" if mean <= max_busy else
             f"MEASURED UNDER LOAD (mean {mean:.2f} cores > {max_busy:g}): not valid as a result")
    return (f"CPU used by other processes per run: mean {mean:.2f}, max {worst:.2f} cores "
            f"({state}).")
