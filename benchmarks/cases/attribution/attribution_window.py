"""Cost of the memory attribution window (the `a` key): a window's step against a plain step,
and what the window costs when it is not open.

    python -m benchmarks run attribution_window [--steps 60] [--rounds 3] [--pairs 7]
        [--pair-steps 40] [--max-busy 0.3] [--no-append]

1. Window step / plain step: the real Trainer (default model: B=16, T=128, 4 layers, dim 128,
   explicit attention, bf16 where the CPU has it natively, else fp32) with a window opened every
   6 steps (``--attribute-at``), so hooked steps (the warm-up and the measured one) and plain
   steps interleave in one run and share whatever else the machine does. Per run: the median
   step_ms of the measured steps over the median of the plain steps (the steps that the
   disturbed rule leaves alone); the event's build (after the step, outside step_ms) is timed
   on its own. Target: ≤ 2× (issue 40).
2. Outside a window: interleaved runs [A, B, A'] (odd rounds reversed) of the same Trainer
   without the attribution hook (A) and with it but never opened (B); tokens/s over the
   measured steps, with the A/A ratio as the noise (benchmarks/harness/pairs.py). Target: B/A
   inside the noise, ≥ 0.98.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from benchmarks.harness import (
    RATIO_HEADER,
    Figure,
    in_thread,
    publish,
    quartiles,
    run_pairs,
    spread,
)
from probes.instruments.attribution import MemoryAttribution
from probes.monitor import default_hooks
from probes.records import is_disturbed
from trainer.config import TrainConfig
from trainer.loop import Trainer

WARMUP = 3
WINDOW_TARGET = 2.0  # a window's step / a plain step
OUTSIDE_TARGET = 0.98  # the hook never opened / no hook
EVERY = 6  # a window every EVERY steps: warm-up + measured + the step after, then 3 plain


def run_trainer(steps: int, hooks: list, attribute_at: list[int] | None = None) -> dict:
    """One real training run; its step rows and memory_attribution events."""
    cfg = TrainConfig(device="cpu", steps=steps, warmup_steps=WARMUP,
                      run_dir=tempfile.mkdtemp(prefix="memtop-bench-"),
                      attribute_at=attribute_at or [], save_weights=False)
    rows: list = []
    events: list = []

    def sink(record) -> None:
        if getattr(record, "step_ms", None) is not None:
            rows.append(record)
        elif getattr(record, "event", None) == "memory_attribution":
            events.append(record.data)

    in_thread(Trainer(cfg, Path(cfg.run_dir), sinks=[sink], hooks=hooks, listen=False).run)
    return {"rows": rows, "events": events}


def window_cost(steps: int, rounds: int) -> dict:
    """Part 1: per run, the measured steps' median step_ms over the plain steps' median."""
    ratios, warm_ratios, plain_ms, window_ms, build_ms, hook_ms = [], [], [], [], [], []
    for _ in range(rounds):
        at = list(range(WARMUP + 3, steps - 2, EVERY))
        hooks = default_hooks(attribute_at=at)
        got = run_trainer(steps, hooks)
        measured = {s for e in got["events"] for s in e["steps"]}
        warm = {s - 1 for s in measured}
        plain = [r.step_ms for r in got["rows"] if r.step > WARMUP and not is_disturbed(r)]
        meas = [r.step_ms for r in got["rows"] if r.step in measured]
        warms = [r.step_ms for r in got["rows"] if r.step in warm]
        if not plain or not meas:
            continue
        p = statistics.median(plain)
        plain_ms.append(p)
        window_ms.append(statistics.median(meas))
        ratios.append(statistics.median(meas) / p)
        warm_ratios.append(statistics.median(warms) / p)
        build_ms += [e["build_ms"] for e in got["events"]]
        hook_ms += [e["hook_ms"] for e in got["events"]]
    return {"ratios": ratios, "warm_ratios": warm_ratios, "plain_ms": plain_ms,
            "window_ms": window_ms, "build_ms": build_ms, "hook_ms": hook_ms}


def outside_cost(args):
    """Part 2: tokens/s of runs with the hook (never opened) against runs without it."""
    def side(with_hook: bool):
        def run() -> float:
            hooks = default_hooks(attribution=with_hook)
            assert any(isinstance(h, MemoryAttribution) for h in hooks) == with_hook
            got = run_trainer(args.pair_steps, hooks)
            tps = [r.tokens_per_s for r in got["rows"] if r.step > WARMUP
                   and not is_disturbed(r) and r.tokens_per_s]
            return statistics.median(tps)
        return run

    return run_pairs(args, "without", {"without": side(False), "with": side(True)},
                     unit="tok/s", fmt=",.0f", wait=False)


def options(ap) -> None:
    ap.add_argument("--steps", type=int, default=60, help="steps of each part-1 run")
    ap.add_argument("--rounds", type=int, default=3, help="part-1 runs")
    ap.pairs(7, "without the hook, with it never opened, without'")
    ap.add_argument("--pair-steps", type=int, default=40, help="steps of each part-2 run")
    ap.add_argument("--max-busy", type=float, default=0.3,
                    help="other processes' cores above which a figure is not judged")


def main(args) -> None:
    one = window_cost(args.steps, args.rounds)
    two = outside_cost(args)
    what = "with the hook, never opened / without (tokens/s)"
    row, _ = two.row("with", what, OUTSIDE_TARGET)
    target = ("met" if one["ratios"] and quartiles(one["ratios"])[1] <= WINDOW_TARGET else
              "missed" if one["ratios"] else "n/a")
    body = f"""Real Trainer, default model B=16, T=128, 4 layers, dim 128, explicit attention,
its amp on this CPU; part 1: a window every {EVERY} steps in one run, {args.rounds} runs; part 2:
interleaved runs with/without the attribution hook, never opened.)

Part 1, a window's step against a plain step of the same run (per-run medians):

| figure | value | target |
|---|---|---|
| measured step / plain step | {spread(one['ratios'])} | ≤ {WINDOW_TARGET:g}× ({target}) |
| warm-up step / plain step | {spread(one['warm_ratios'])} | |
| plain step | {spread(one['plain_ms'], '{:.1f}', ' ms')} | |
| measured step | {spread(one['window_ms'], '{:.1f}', ' ms')} | |
| the meter's own hook time in the measured step | {spread(one['hook_ms'], '{:.2f}', ' ms')} | |
| building the event after the step (outside step_ms) | \
{spread(one['build_ms'], '{:.2f}', ' ms')} | |

Part 2, outside a window (the hook in the list, no window opened; tokens/s):

{RATIO_HEADER}
{row}

{two.note()}
"""
    publish(args, "Memory attribution window cost (issue 40)", body, [
        Figure("attribution_window/window_step", "a memory attribution window's measured step "
               "/ a plain step of the same run", f"≤ {WINDOW_TARGET:g}×",
               spread(one["ratios"], bold=False), target),
        two.figure("attribution_window/unopened", "runs with the attribution hook never opened "
                   "/ without it, tokens/s", "with", OUTSIDE_TARGET)])

