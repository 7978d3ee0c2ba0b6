"""Shared by the benchmark scripts: machine description, medians and percentiles, appending to
RESULTS.md, the /proc readers (CPU, RSS, load: what else ran) and interleaved pairs with their
A/A noise."""

from __future__ import annotations

import math
import os
import platform
import statistics
import subprocess
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


def publish(title: str, body: str, append: bool, shown: str | None = None) -> None:
    """A benchmark's last words: the machine line and its figures (``shown``, else the whole
    section) on stdout, then the section appended to RESULTS.md unless --no-append."""
    print(machine())
    print(body if shown is None else shown)
    if append:
        append_results(title, body)


# ---- ratio benchmarks: interleaved pairs with their own A/A noise -----------------------------
#
# On a shared 2-core machine one run differs from the next by ±5% or more (RESULTS.md), so a 1-2%
# target cannot be judged from a handful of A-then-B repeats. Every ratio benchmark therefore runs
# rounds of [A, B1..Bk, A'] (odd rounds reversed: [A', Bk..B1, A]), takes each Bi/A and the A/A
# ratio A'/A from the same round, and judges the median Bi/A against the target only when the
# target lies outside the A/A noise band around it.

MIN_PAIRS = 7  # fewer pairs: the figures are printed but never judged


def _clock_ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def cpu_busy_s() -> float:
    """CPU seconds all cores have spent busy since boot (/proc/stat)."""
    with open("/proc/stat", encoding="ascii") as fh:
        vals = [int(v) for v in fh.readline().split()[1:]]
    return (sum(vals) - vals[3] - vals[4]) / _clock_ticks()


def own_cpu_s(pid: int | None = None) -> float:
    """utime + stime of a process (this one by default), children excluded, in seconds."""
    return proc_cpu_s(pid or os.getpid()) or 0.0


def proc_cpu_s(pid: int, tid: int | None = None) -> float | None:
    """utime + stime of a process (or one of its threads) in seconds; None when it is gone."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        with open(path, encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _clock_ticks()
    except (OSError, IndexError, ValueError):
        return None


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
        with open("/proc/stat", encoding="ascii") as fh:
            vals = [int(v) for v in fh.readline().split()[1:]]
        return sum(vals), vals[3] + vals[4]  # total, idle + iowait

    t1, i1 = snap()
    time.sleep(interval_s)
    t2, i2 = snap()
    return (os.cpu_count() or 1) * (1 - (i2 - i1) / max(1, t2 - t1))


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


def top_cpu() -> str:
    """The busiest process right now (what loads the shared cores), one short string."""
    try:
        out = subprocess.run(["ps", "-eo", "pcpu,pid,args", "--sort=-pcpu"],
                             capture_output=True, text=True, timeout=5).stdout.splitlines()
        return out[1].strip()[:100] if len(out) > 1 else "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


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


def _children_cpu_s() -> float:
    """CPU of this process's waited-for children (subprocess runs, tmux-less sides)."""
    t = os.times()
    return t.children_user + t.children_system


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(Q1, median, Q3), inclusive method (well defined from 2 values on)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); nan for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))
    return s[k]


def noise_band(aa: list[float], pairs: int) -> float:
    """Half-width of the band around a median ratio of ``pairs`` pairs that noise alone
    explains (see verdict)."""
    q1, _, q3 = quartiles(aa)
    return 1.3 * (q3 - q1) / math.sqrt(max(1, pairs))


def verdict(ratio_median: float, aa: list[float], target: float, pairs: int,
            others_cores: float, max_busy: float, higher_is_better: bool = True) -> str:
    """met / missed / inside noise (cannot tell); never a verdict from < MIN_PAIRS pairs or
    from runs other processes disturbed.

    Noise band around the median ratio: 1.3 × the A/A interquartile range / √pairs. The median
    of n pairs has a standard error of about 0.93 × IQR / √n (normal noise: IQR = 1.35 σ,
    SE(median) = 1.25 σ / √n), so the band is ~1.4 standard errors: half the A/A IQR at 7
    pairs, narrower with more pairs. A target inside it cannot be told apart from noise."""
    if pairs < MIN_PAIRS:
        return f"not judged ({pairs} pairs < {MIN_PAIRS})"
    if others_cores > max_busy:
        return f"not judged (under load: others used {others_cores:.2f} cores)"
    half = noise_band(aa, pairs)
    if abs(ratio_median - target) <= half:
        return "inside noise (cannot tell)"
    ok = ratio_median >= target if higher_is_better else ratio_median <= target
    return "met" if ok else "missed"


def interleaved_pairs(baseline: str, sides: dict, pairs: int, on_result=None) -> dict:
    """Run ``pairs`` rounds of [A, B1..Bk, A'] (odd rounds reversed). ``sides`` maps a label to
    a callable returning one figure (e.g. tokens/s, higher = better), or (figure, cores other
    processes used meanwhile) when the side runs outside this process tree (a tmux pane);
    ``baseline`` is A.

    Returns {"values": {label: [...]}, "aa": [A'/A per round], "ratios": {B: [B/A per round]},
    "others_cores": [per run], "seconds": wall}."""
    others = [s for s in sides if s != baseline]
    values: dict[str, list[float]] = {s: [] for s in sides}
    aa: list[float] = []
    ratios: dict[str, list[float]] = {s: [] for s in others}
    loads: list[float] = []
    t0 = time.monotonic()
    for rnd in range(pairs):
        order = ["A", *others, "A'"]
        if rnd % 2:
            order.reverse()
        got: dict[str, float] = {}
        for label in order:
            meter = LoadMeter()
            value = sides[baseline]() if label in ("A", "A'") else sides[label]()
            if isinstance(value, tuple):
                value, others_cores = value
                loads.append(others_cores)
            else:
                loads.append(meter.others_cores())
            got[label] = value
            if on_result is not None:
                on_result(rnd, label if label not in ("A", "A'") else f"{baseline} ({label})",
                          value, loads[-1])
        values[baseline].append(got["A"])
        aa.append(got["A'"] / got["A"])
        for s in others:
            values[s].append(got[s])
            ratios[s].append(got[s] / got["A"])
    return {"values": values, "aa": aa, "ratios": ratios, "others_cores": loads,
            "seconds": time.monotonic() - t0}


RATIO_HEADER = ("| comparison | pairs | median ratio | min–max | IQR (Q1–Q3) | A/A median | "
                "A/A min–max | A/A IQR | noise band | target | verdict |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|")


def ratio_row(name: str, ratios: list[float], aa: list[float], target: float,
              others_cores: float, max_busy: float,
              higher_is_better: bool = True) -> tuple[str, str]:
    """One row of RATIO_HEADER's table, and its verdict."""
    q1, med, q3 = quartiles(ratios)
    a1, amed, a3 = quartiles(aa)
    v = verdict(med, aa, target, len(ratios), others_cores, max_busy, higher_is_better)
    sign = "≥" if higher_is_better else "≤"
    row = (f"| {name} | {len(ratios)} | **{med:.3f}** | {min(ratios):.3f}–{max(ratios):.3f} | "
           f"{q1:.3f}–{q3:.3f} | {amed:.3f} | {min(aa):.3f}–{max(aa):.3f} | {a1:.3f}–{a3:.3f} | "
           f"±{noise_band(aa, len(ratios)):.3f} | {sign} {target:g} | {v} |")
    return row, v


def load_note(others: list[float], max_busy: float) -> str:
    """The sentence every ratio section carries about what else ran."""
    worst = max(others) if others else 0.0
    mean = statistics.fmean(others) if others else 0.0
    state = ("quiet machine" if mean <= max_busy else
             f"MEASURED UNDER LOAD (mean {mean:.2f} cores > {max_busy:g}): not valid as a result")
    return (f"CPU used by other processes per run: mean {mean:.2f}, max {worst:.2f} cores "
            f"({state}).")
