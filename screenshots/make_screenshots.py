"""Make the README's SVGs from the real app on a real short CPU run (never drawn by hand).

    python screenshots/make_screenshots.py [--out screenshots] [--steps-before 40] [--only F..]

Drives MemtopApp with Textual's Pilot (headless, no terminal needed) over the default mini-GPT on
the CPU and saves: dashboard.svg (120×40), dashboard-80x24.svg, help.svg, profiler.svg (after `p`),
modules.svg (after `a`: the per-module memory window's table), leak.svg (after `l`, once the
detector raises its alert) and culprit.svg (the culprit finder's answer to that alert, a few
steps later); ``--only culprit.svg`` remakes only the files named.
A view whose producer is missing in this build (no profiler window, no leak detector) is
skipped with a line saying so.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
os.environ.setdefault("KINETO_LOG_LEVEL", "5")

from probes.runfolder import create_run_dir  # noqa: E402
from trainer.config import TrainConfig  # noqa: E402
from tui.app import MemtopApp  # noqa: E402
from tui.widgets.help_screen import HelpScreen  # noqa: E402


async def wait_for(pilot, condition: Callable[[], bool], timeout_s: float) -> bool:
    waited = 0.0
    while not condition():
        if waited >= timeout_s:
            return False
        await pilot.pause(0.2)
        waited += 0.2
    return True


ONLY: set[str] = set()  # --only: the files to write (all when empty)


def save(app: MemtopApp, out: Path, name: str) -> None:
    if ONLY and name not in ONLY:
        return
    path = app.save_screenshot(filename=name, path=str(out))
    print(f"wrote {path}", flush=True)


async def settle(app: MemtopApp, pilot) -> None:
    """Bring the chart up to date and let two refreshes land before a picture."""
    app.redraw_chart()
    ticks = app.ticks
    await wait_for(pilot, lambda: app.ticks >= ticks + 2, 10)
    await pilot.pause(0.3)


async def main_run(out: Path, root: Path, steps_before: int, timeout_s: float) -> int:
    config = TrainConfig(device="cpu", steps=0, run_dir=str(root))
    app = MemtopApp.for_run(config, create_run_dir(root), freeze_gc=False)
    async with app.run_test(size=(120, 40)) as pilot:
        if not await wait_for(pilot, lambda: app.trainer.status.step >= steps_before, timeout_s):
            print("the trainer did not reach the first steps; no screenshots", file=sys.stderr)
            return 1
        await settle(app, pilot)
        save(app, out, "dashboard.svg")

        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), 10)
        await pilot.pause(0.3)
        save(app, out, "help.svg")
        await pilot.press("escape")
        await pilot.pause(0.3)

        for name, request, key, ready, what in (
                ("profiler.svg", "profile", "p", lambda: bool(app.ops_table.ops),
                 "profiler window"),
                ("modules.svg", "attribute", "a", lambda: app.modules_table.loaded,
                 "memory window")):
            if ONLY and name not in ONLY:
                continue
            if not app.can(request):
                print(f"skipped {name}: no {what} in this build", file=sys.stderr)
                continue
            await pilot.press(key)
            if await wait_for(pilot, ready, timeout_s):
                app.clear_notifications()
                await settle(app, pilot)
                save(app, out, name)
            else:
                print(f"skipped {name}: no {what}'s table arrived", file=sys.stderr)

        await pilot.press("l")
        if await wait_for(pilot, lambda: app.leak_banner.shown, timeout_s):
            app.clear_notifications()
            await settle(app, pilot)
            save(app, out, "leak.svg")
            if await wait_for(pilot, lambda: app.culprit_box.data is not None, timeout_s):
                app.clear_notifications()
                await settle(app, pilot)
                save(app, out, "culprit.svg")
            else:
                print("skipped culprit.svg: the finder did not answer", file=sys.stderr)
        else:
            print("skipped leak.svg: no leak alert (is the detector in default_hooks?)",
                  file=sys.stderr)
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_code is not None, timeout_s)
    return 0


async def compact_run(out: Path, root: Path, steps_before: int, timeout_s: float) -> None:
    config = TrainConfig(device="cpu", steps=0, run_dir=str(root))
    app = MemtopApp.for_run(config, create_run_dir(root), freeze_gc=False)
    async with app.run_test(size=(80, 24)) as pilot:
        if await wait_for(pilot, lambda: app.trainer.status.step >= steps_before, timeout_s):
            await settle(app, pilot)
            save(app, out, "dashboard-80x24.svg")
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_code is not None, timeout_s)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--steps-before", type=int, default=40,
                        help="steps to train before the first picture")
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="seconds to wait for each thing to appear")
    parser.add_argument("--only", nargs="+", default=[], metavar="FILE",
                        help="write only these files (e.g. culprit.svg)")
    args = parser.parse_args()
    ONLY.update(args.only)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="memtop-shots-") as tmp:
        code = asyncio.run(main_run(args.out, Path(tmp), args.steps_before, args.timeout))
        if code == 0 and (not ONLY or "dashboard-80x24.svg" in ONLY):
            asyncio.run(compact_run(args.out, Path(tmp), args.steps_before, args.timeout))
    return code


if __name__ == "__main__":
    sys.exit(main())
