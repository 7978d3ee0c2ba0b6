"""GPU claim about the dashboard over a CUDA trainer: drawn at 120×40 in Textual's test driver,
the GPU named, the panes filled, screenshots saved, the trainer joined after q."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import torch

from benchmarks.gpu.device import free_device
from benchmarks.gpu.registry import Ctx, Outcome, claim


@claim(group="dashboard", needs_s=40, priority=80, limit_s=150)
def dashboard_renders_on_cuda(ctx: Ctx) -> Outcome:
    """the dashboard (120×40, App.run_test) over a CUDA trainer: panes filled, the GPU named in
    the header, the scale pane live (fp16), dashboard.svg and (when the table arrives)
    profiler.svg saved, the trainer joined after q"""
    try:
        from tui.app import MemtopApp
    except ImportError as exc:
        return Outcome.not_run(f"the dashboard cannot import: {exc}")
    return asyncio.run(_dashboard(ctx, MemtopApp))


async def _dashboard(ctx: Ctx, app_class: Any) -> Outcome:
    import torch._dynamo  # noqa: F401  (see below)

    from probes.runfolder import create_run_dir

    # torch.optim's first optimizer imports torch._dynamo, whose sympy keeps `from sys import
    # stdout` as a module global: imported while the app captures stdout, it would hold the
    # app (and its run) for good. Every other claim imports it first; --only dashboard too.

    app = app_class.for_run(ctx.config(steps=0), create_run_dir(ctx.out / "runs" / "dashboard"),
                            freeze_gc=False)
    problems: list[str] = []
    figures: dict[str, Any] = {}

    async def wait_for(pilot, cond, timeout_s: float) -> bool:
        t0 = time.monotonic()
        while not cond():
            if time.monotonic() - t0 > min(timeout_s, max(1.0, ctx.left_s() - 5)):
                return False
            await pilot.pause(0.2)
        return True

    try:
        async with app.run_test(size=(120, 40)) as pilot:
            try:
                await _look(ctx, app, pilot, wait_for, problems, figures)
            finally:  # whatever happened, q: the trainer stops at its next step boundary
                await pilot.press("q")
                await wait_for(pilot, lambda: app.return_code is not None, 60)
    finally:
        app.shutdown(timeout_s=30)  # and is joined before the claim ends
    if app.trainer.alive:
        problems.append("the trainer thread is still alive after q")
    app = None  # the app holds the trainer and its model: gone before the cache is emptied
    free_device()
    alive = [t.name for t in threading.enumerate() if t.name.startswith("memtop-trainer")]
    return Outcome.check(not problems, "; ".join(problems) or
                         f"header: {str(figures.get('header', '')).strip()}; svgs: "
                         f"{[k for k in figures if k.endswith('svg')]}",
                         trainer_threads_left=alive, **figures)


async def _look(ctx: Ctx, app: Any, pilot: Any, wait_for: Any, problems: list[str],
                figures: dict[str, Any]) -> None:
    """30 steps on screen: the panes, the header, dashboard.svg; then p and profiler.svg."""
    ok = await wait_for(pilot, lambda: app.trainer.status.step >= 30
                        or app.trainer.status.state == "failed", 90)
    if not ok or app.trainer.status.state == "failed":
        problems.append(f"trainer: {app.trainer.status.state}, step "
                        f"{app.trainer.status.step}, {app.trainer.status.error}")
        return
    app.redraw_chart()
    ticks = app.ticks
    await wait_for(pilot, lambda: app.ticks >= ticks + 2, 10)
    await pilot.pause(0.3)
    figures["dashboard_svg"] = str(app.save_screenshot(filename="dashboard.svg",
                                                       path=str(ctx.out)))
    panes = {k: p.top_text for k, p in app.panes.items()}
    figures.update(header=app.header_bar.text, panes=panes)
    name = torch.cuda.get_device_name(ctx.torch_device)
    if "n/a" in panes["allocated"]:
        problems.append(f"allocated pane: {panes['allocated']}")
    if name.split()[-1] not in app.header_bar.text:
        problems.append(f"GPU name not in the header: {app.header_bar.text}")
    if "no scaler" in panes["scale"]:
        problems.append(f"scale pane: {panes['scale']}")
    await pilot.press("p")
    if await wait_for(pilot, lambda: bool(app.ops_table.ops), 60):
        app.clear_notifications()
        await pilot.pause(0.6)
        figures["profiler_svg"] = str(app.save_screenshot(filename="profiler.svg",
                                                          path=str(ctx.out)))
