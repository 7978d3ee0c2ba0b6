"""GPU claims about the culprit finder on CUDA: a kept device tensor is named by its holder and
by the line that allocated it (allocator history between the two looks), the history is off
again afterwards, the look stays within its time, and the healthy loops raise nothing.

The loops are examples/leaky_loops.py's, on the device; the pure grouping of the history
(probes/traces/snapshot.py ``live_by_site``) is tested on CPU on a real snapshot
(tests/unit/test_snapshot.py)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

from benchmarks.gpu.device import history_recording, sees_history_when_on
from benchmarks.gpu.registry import Ctx, Outcome, claim
from benchmarks.harness.examples import example

leaky_loops = example("leaky_loops")

LOOK_TARGET_S = 1.0


def culprit_run(ctx: Ctx, loop: str, steps: int = 30) -> dict[str, Any]:
    """One leaky_loops run on the device; its leak events, as plain data."""
    try:
        run_dir = leaky_loops.train(loop, steps, ctx.out / "culprits", device=ctx.device,
                                    listen=False, write_report=False, ledger=False,
                                    profiler=False)
    finally:  # the example's lists keep the leak's tensors after its run (1.5 MiB on the H200)
        leaky_loops.release()
    rows = [json.loads(line) for line in Path(run_dir, "metrics.jsonl").open()]
    return {"alerts": [r for r in rows if r.get("event") == "leak_suspected"],
            "culprits": [r for r in rows if r.get("event") == "leak_culprit"],
            "run_dir": str(run_dir)}


def forward_line() -> int:
    """The line of Net.forward that allocates the output (read from the file)."""
    lines, start = inspect.getsourcelines(leaky_loops.Net.forward)
    return start + next(i for i, text in enumerate(lines) if "return self.fc2" in text)


@claim(group="culprits", needs_s=30, priority=60)
def culprit_cuda_logits_named(ctx: Ctx) -> Outcome:
    """a device tensor kept per step is named by its list and by the line that allocated it,
    from the allocator history of the window"""
    d = ctx.shared("culprit_logits", lambda: culprit_run(ctx, "logits"))
    if not d["culprits"]:
        return Outcome.check(False, f"no leak_culprit event ({len(d['alerts'])} alerts)")
    culprits = d["culprits"][0].get("culprits") or []
    held = [c for c in culprits if c.get("kind") == "tensors"
            and "`kept_outputs`" in str(c.get("holder"))]
    want = f"leaky_loops.py:{forward_line()}"
    sites = [c for c in culprits if c.get("kind") == "cuda" and want in str(c.get("where"))]
    per_step = sites[0]["bytes_per_step"] if sites else None
    return Outcome.check(bool(held) and bool(sites) and per_step == 128 * 256 * 4,
                         f"holder {'named' if held else 'MISSING'}; site {want}: "
                         f"{per_step} bytes/step (want {128 * 256 * 4})",
                         culprits=culprits)


@claim(group="culprits", needs_s=30, priority=60)
def culprit_cuda_history_off_after(ctx: Ctx) -> Outcome:
    """the finder's allocator history is off again after its second look (and its cost is
    recorded)"""
    d = ctx.shared("culprit_logits", lambda: culprit_run(ctx, "logits"))
    cost = d["culprits"][0].get("cuda_history_s") if d["culprits"] else None
    dev = ctx.torch_device
    probe_sees, on_after = sees_history_when_on(dev), history_recording(dev)
    return Outcome.check(probe_sees and not on_after and cost is not None,
                         f"probe sees history when on: {probe_sees}; on after the run: "
                         f"{on_after}; history cost {cost} s", cuda_history_s=cost)


@claim(group="culprits", needs_s=30, priority=60)
def culprit_cuda_look_time(ctx: Ctx) -> Outcome:
    """both looks together stay under 1 s on a CUDA run"""
    d = ctx.shared("culprit_logits", lambda: culprit_run(ctx, "logits"))
    look = d["culprits"][0].get("look_s") if d["culprits"] else None
    return Outcome.check(isinstance(look, (int, float)) and look <= LOOK_TARGET_S,
                         f"look_s {look} (objects scanned "
                         f"{d['culprits'][0].get('objects_scanned') if d['culprits'] else '?'})",
                         look_s=look)


@claim(group="culprits", needs_s=40, priority=60)
def culprit_cuda_healthy_quiet(ctx: Ctx) -> Outcome:
    """the healthy loops (an EMA deepcopy, a buffer held 10 of every 20 steps) raise no alert
    and no culprit event on CUDA"""
    found = {loop: culprit_run(ctx, loop, steps=60) for loop in leaky_loops.HEALTHY}
    noisy = {loop: (len(d["alerts"]), len(d["culprits"])) for loop, d in found.items()
             if d["alerts"] or d["culprits"]}
    return Outcome.check(not noisy, f"alerts/culprits per healthy loop: {noisy or 'none'}")
