"""The CUDA step path's Python overhead, timed where no GPU is (issue 45): what memtop's own code
around torch's CUDA calls costs per step, with the C calls replaced by an event class whose
record / query / elapsed_time do nearly nothing, beside what the path before issue 45 paid in
torch.cuda's Python layer for the same work.

    python -m benchmarks run cuda_hot_path [--rounds 30] [--no-append]

Rows (µs per step, median of ``--rounds`` rounds of BLOCK steps, min–max):
- ``split, event path``: the step split on the event clock (the ring, one query a step, the
  split and span read back, events returned) on a 4×4 Linear's step, minus the same step
  with the split on the host clock; the C calls are the stand-in's (~0.1 µs each), so on a
  GPU add ~2.3 µs per recorded mark (host-call-floor.txt: Event.record with the stream given)
  and ~1.6 µs per query.
- ``device index lookups, before``: torch.cuda's ``_get_device_index`` as the old path called
  it per step (8 marks through ``current_stream()``, the stats read, the peak reset: 10
  calls), the part of its Python layer that runs without a GPU; the new path makes none.
- ``values, before / after``: the step's three scalars read as before (``torch.stack`` +
  ``tolist``) and through StepValueReader's slots, on CPU tensors (on CUDA add the copies and
  the one wait, the same for both).
- ``Monitor, event clock``: a whole monitored step (every default instrument, the row written)
  with the split on the event clock, minus the plain step: the Monitor's host cost as a CUDA
  run pays it, less torch's C calls (the target on a GPU: ≤ 100 µs now, ≤ 50 the goal).

The machine is shared: the figures need a quiet re-run before they are compared with others.
"""

from __future__ import annotations

import statistics
import tempfile
from typing import Any

import torch

from benchmarks.cases.step_cost.monitor_fixed_cost import one_step
from benchmarks.harness import Figure, in_thread, median, per_call_us, publish, quartiles, spread
from probes import Monitor
from probes.instruments.phase_split import EventRing, PendingSplits
from probes.instruments.phases import PhaseClock
from probes.monitor.stepvalues import StepValueReader

BLOCK = 50


class Stream:
    """The stand-in stream: a counter of marks (each lands 1 µs after the last)."""

    def __init__(self) -> None:
        self.cursor = 0.0


class InstantEvent:
    """An event the stand-in device has always reached: record / query / elapsed_time as
    torch.cuda.Event answers them, at nearly no cost (what is left is memtop's bookkeeping)."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at = 0.0

    def record(self, stream: Stream) -> None:
        stream.cursor += 0.001
        self.at = stream.cursor

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: InstantEvent) -> float:
        return end.at - self.at


def event_clock() -> tuple[EventRing, PendingSplits]:
    ring = EventRing(InstantEvent, InstantEvent.record, Stream())
    return ring, PendingSplits(InstantEvent.elapsed_time, InstantEvent.query,
                               release=ring.give_back)


def measure(rounds: int) -> dict[str, list[float]]:
    torch.set_num_threads(1)
    x = torch.randn(4, 4)
    out: dict[str, list[float]] = {k: [] for k in (
        "host_split", "event_split", "index_before", "values_before", "values_after",
        "plain", "monitored_event", "monitored_host")}

    def clocked(events: Any) -> tuple[Any, Any, Any]:
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        return model, opt, PhaseClock(model, opt, torch.device("cpu"), events=events)

    sides = {"host_split": clocked(None), "event_split": clocked(event_clock())}

    def split_step(name: str) -> None:
        model, opt, clock = sides[name]
        clock.begin(1, 0.0)
        one_step(model, opt, x, None)
        clock.stop()
        clock.end(1.0)
        clock.left()

    from torch.cuda._utils import _get_device_index

    dev = torch.device("cuda", 0)

    def index_before() -> None:
        for _ in range(10):
            _get_device_index(dev, optional=True)

    scalars = (torch.tensor(2.5), torch.tensor(0.7), torch.tensor(65536.0))
    reader = StepValueReader(slot_devices=("cpu",))

    def values_before() -> None:
        torch.stack([v.detach().reshape(-1)[0].float() for v in scalars]).tolist()

    def values_after() -> None:
        reader.read(*scalars)

    with tempfile.TemporaryDirectory() as tmp:
        def monitored(event: bool) -> tuple[Any, Any, Monitor]:
            model = torch.nn.Linear(4, 4)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            mon = Monitor(model, opt, samples_per_step=4, run_dir=tmp, write_report=False,
                          listen=False)
            if event:  # the event clock CUDA runs get, over the stand-in events
                assert mon.phases is not None
                mon.phases.close()
                mon.phases = PhaseClock(model, opt, torch.device("cpu"),
                                        own_forward_hook=False, events=event_clock())
            return model, opt, mon

        runs = {"plain": (torch.nn.Linear(4, 4), None, None), "monitored_event": monitored(True),
                "monitored_host": monitored(False)}
        plain_model = runs["plain"][0]
        runs["plain"] = (plain_model, torch.optim.SGD(plain_model.parameters(), lr=0.01), None)

        def run_step(name: str) -> None:
            model, opt, mon = runs[name]
            one_step(model, opt, x, mon)

        jobs = {"host_split": lambda: split_step("host_split"),
                "event_split": lambda: split_step("event_split"),
                "index_before": index_before, "values_before": values_before,
                "values_after": values_after,
                **{name: (lambda n=name: run_step(n)) for name in runs}}
        for _ in range(4):  # warm every path
            for fn in jobs.values():
                per_call_us(fn, BLOCK)
        for r in range(rounds):
            for name in (list(jobs) if r % 2 == 0 else list(jobs)[::-1]):
                out[name].append(per_call_us(jobs[name], BLOCK))
        for _m, _o, mon in runs.values():
            if mon is not None:
                mon.close()
    for _model, _opt, clock in sides.values():
        clock.close()
    return out


def _row(label: str, values: list[float]) -> str:
    q1, med, q3 = quartiles(values)
    return (f"| {label} | **{med:.1f} µs** (IQR {q1:.1f}–{q3:.1f}) | "
            f"{min(values):.1f}–{max(values):.1f} |")


def options(ap) -> None:
    ap.add_argument("--rounds", type=int, default=30)


def main(args) -> None:
    res = in_thread(measure, args.rounds)

    def diff(a: str, b: str) -> list[float]:
        return [x - y for x, y in zip(res[a], res[b], strict=True)]

    body = (
        f"The CUDA step path's Python overhead without a GPU (stand-in events: record / query / "
        f"elapsed_time at ~0.1 µs), a 4×4 Linear + SGD, 1 thread; {args.rounds} rounds of "
        f"{BLOCK} steps each, order alternating.\n\n"
        "| figure (per step) | median | min–max |\n|---|---|---|\n"
        + _row("split on the event clock − split on the host clock (ring, 1 query, split "
               "and span read back)", diff("event_split", "host_split")) + "\n"
        + _row("before: torch.cuda `_get_device_index` × 10 (8 marks' `current_stream()`, "
               "the stats read, the peak reset); after: none", res["index_before"]) + "\n"
        + _row("values before: `torch.stack` + `tolist` of 3 scalars", res["values_before"])
        + "\n" + _row("values after: StepValueReader's slots (made once), one read",
                      res["values_after"]) + "\n"
        + _row("Monitor on the event clock − plain (every default instrument, the row "
               "written; torch's CUDA C calls not included)", diff("monitored_event", "plain"))
        + "\n" + _row("Monitor on the host clock − plain (the CPU run's cost, for reference)",
                      diff("monitored_host", "plain")) + "\n"
        + f"| plain step | {median(res['plain']):.0f} µs | {min(res['plain']):.0f}–"
          f"{max(res['plain']):.0f} |\n\n"
        "On a GPU add per step ~8 × 2.3 µs (Event.record with the stream given), ~1.6 µs (one "
        "query), ~5 elapsed_time calls, ~14.5 µs (the raw stats call), the slots' copies and "
        "the one wait (../shared/gpu-artifacts/h200-first-run/host-call-floor.txt); the GPU "
        "claims monitor_fixed_cost_cuda and step_overhead_* measure the whole.")
    event = diff("monitored_event", "plain")
    publish(args, "CUDA hot path's Python overhead (issue 45)", body, [Figure(
        "cuda_hot_path/monitor_event", "a monitored step on the CUDA event clock − plain, "
        "torch's CUDA C calls left out (stand-in events, CPU)", "≤ 100 µs on a GPU, with the C "
        "calls (≤ 50 the goal)", spread(event, "{:.1f}", " µs", False), "not judged (no GPU)")])
    print(f"(spread of the Monitor's cost across rounds: ±{statistics.pstdev(event):.1f} µs)")
