"""The loops every timing benchmark shares: torch work on a thread of its own, µs per call,
units per second over a block of steps, and the interleaved pairs with their A/A noise.

Ratio benchmarks run rounds of [A, B1..Bk, A'] (odd rounds reversed: [A', Bk..B1, A]), take each
Bi/A and the A/A ratio A'/A from the same round, and judge the median Bi/A against the target
only when the target lies outside the A/A noise band around it (stats.verdict). ``run_pairs`` is
that whole loop for a case: wait for quiet cores, print each side as it comes, and hand back the
rows, the figures and the sentence about what else ran.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import threading
import time
from collections.abc import Callable

from benchmarks.harness.procfs import LoadMeter, load_note, wait_quiet
from benchmarks.harness.results import Figure
from benchmarks.harness.stats import ratio_row, ratio_value


def in_thread(fn, *args, **kwargs):
    """Run torch work off the main thread, as memtop's trainer does: a parallel torch op on the
    main thread slows every later background trainer in this process ~3×
    (docs/ARCHITECTURE.md). Its exception is re-raised on the caller's thread."""
    box: dict = {}

    def target() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised on the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def per_call_us(fn: Callable[[], object], n: int, rounds: int = 1) -> float:
    """µs per call of ``fn``: the median over ``rounds`` of the mean of ``n`` calls."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(times)


def units_per_s(step: Callable[[], object], steps: int, units: float) -> float:
    """``steps`` calls of ``step``; ``units`` (tokens, samples) per step per second."""
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * units / (time.perf_counter() - t0)


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


@dataclasses.dataclass
class Pairs:
    """The result of a case's interleaved pairs, judged with the case's --max-busy."""

    res: dict
    max_busy: float

    @property
    def values(self) -> dict[str, list[float]]:
        return self.res["values"]

    @property
    def ratios(self) -> dict[str, list[float]]:
        return self.res["ratios"]

    @property
    def others(self) -> list[float]:
        return self.res["others_cores"]

    @property
    def minutes(self) -> float:
        return self.res["seconds"] / 60

    def mean_others(self) -> float:
        return sum(self.others) / len(self.others) if self.others else 0.0

    def note(self) -> str:
        return load_note(self.others, self.max_busy)

    def row(self, side: str, label: str, target: float,
            higher_is_better: bool = True) -> tuple[str, str]:
        """RATIO_HEADER's row for ``side``/baseline, and its verdict."""
        return ratio_row(label, self.ratios[side], self.res["aa"], target, self.mean_others(),
                         self.max_busy, higher_is_better)

    def figure(self, fid: str, what: str, side: str, target: float,
               higher_is_better: bool = True) -> Figure:
        """RESULTS.md's row for ``side``'s ratio: the median with its IQR and noise band."""
        _, verdict = self.row(side, what, target, higher_is_better)
        sign = "≥" if higher_is_better else "≤"
        return Figure(fid, what, f"{sign} {target:g}",
                      ratio_value(self.ratios[side], self.res["aa"]), verdict)


def run_pairs(args: argparse.Namespace, baseline: str, sides: dict, *, unit: str = "/s",
              fmt: str = ",.1f", wait: bool = True, show: bool = True) -> Pairs:
    """A case's whole ratio loop: wait for quiet cores (--max-busy, --max-wait), run --pairs
    rounds printing each side as it comes (``show``), and return the judged Pairs."""
    if wait:
        wait_quiet(args.max_busy, args.max_wait, "before the first round")

    def printed(rnd: int, label: str, value: float, others: float) -> None:
        print(f"round {rnd + 1} {label:>20}: {value:{fmt}} {unit} (others {others:.2f} cores)",
              flush=True)

    return Pairs(interleaved_pairs(baseline, sides, args.pairs,
                                   on_result=printed if show else None), args.max_busy)
