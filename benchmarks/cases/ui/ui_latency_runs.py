"""The ui_latency case's two runs. Part 1 (in_process): the real MemtopApp over a real trainer
thread in Textual's headless driver, keys pressed from a thread through the driver's input
path, with ui_latency_probes.py's frame probe, work spans and lag monitor installed. Part 2
(in_tmux): `memtop train` in a tmux pane, `?` sent with send-keys and the screen polled until
it changes.
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import threading
import time

from benchmarks.cases.ui.ui_latency_probes import Probe, Spans, group_of, lag_monitor
from benchmarks.harness.procfs import cpu_busy_s, proc_cpu_s
from benchmarks.harness.runs import screen_step
from benchmarks.harness.terminal import TmuxPane, memtop_argv

# ---- part 1: in process ------------------------------------------------------------------------

def footer_watcher_fix(install: bool):
    """The workaround proposed for Textual issue #6666 (Footer.compose data_binds each FooterKey
    to Footer.compact; the watcher entries of removed keys stay on the Footer forever, so every
    screen change leaks ~9 FooterKeys with their caches): drop entries of detached keys before
    each recompose. Installed only for the A/B run; returns an undo function."""
    from textual.widgets import Footer

    original = Footer.compose
    if not install:
        return lambda: None

    def compose(self):
        watchers = getattr(self, "__watchers", {}).get("compact")
        if watchers:
            watchers[:] = [(r, cb) for r, cb in watchers if getattr(r, "is_attached", True)]
        yield from original(self)

    Footer.compose = compose
    return lambda: setattr(Footer, "compose", original)


def injector(app, probe: Probe, stop: threading.Event, results: list[dict],
             profile_every_s: float, rng: random.Random, quiet_s: float,
             marks: dict[str, float]) -> None:
    """Presses keys like a user would, from a thread, through the driver's input path."""
    from textual import events

    from tui.widgets.help_screen import HelpScreen

    driver = app._driver
    help_open = lambda s: isinstance(s, HelpScreen)  # noqa: E731
    help_closed = lambda s: not isinstance(s, HelpScreen)  # noqa: E731
    pausing = lambda s: "PAUS" in app.header_bar.text  # noqa: E731
    resumed = lambda s: "PAUS" not in app.header_bar.text  # noqa: E731
    profile_asked = lambda s: any(w in app.status_line.text  # noqa: E731
                                  for w in ("requested", "wait", "warmup", "active"))
    cycle = 0
    next_profile = time.monotonic() + profile_every_s / 2

    def press(key: str, char: str | None, label: str, predicate) -> None:
        phase_before = app.trainer.status.profile_phase
        probe.resolved.clear()
        probe_t0 = time.perf_counter()
        probe.pending = (label, probe_t0, predicate)
        driver.process_message(events.Key(key, char))
        ok = probe.resolved.wait(5.0)
        results.append({"key": label, "ms": probe.latency_ms if ok else None,
                        "t0": probe_t0,
                        "group": group_of((phase_before, app.trainer.status.profile_phase)),
                        "step": app.trainer.status.step})
        probe.pending = None

    # the quiet part: training with no key presses but `p` twice (what a user who just watches
    # sees: refresh ticks, chart rebuilds, gc, profiler windows and their analysis)
    t_quiet = time.monotonic()
    for at in (3.0, quiet_s / 2 + 3.0):
        if quiet_s >= at + 10 and not stop.wait(max(0.0, t_quiet + at - time.monotonic())):
            if app.trainer.status.profile_phase is None:
                press("p", "p", "p (profiler requested)", profile_asked)
    stop.wait(max(0.0, t_quiet + quiet_s - time.monotonic()))
    marks["keys_start"] = time.perf_counter()
    next_profile = time.monotonic() + profile_every_s / 2
    while not stop.wait(rng.uniform(0.2, 0.6)):
        if time.monotonic() >= next_profile and app.trainer.status.profile_phase is None:
            press("p", "p", "p (profiler requested)", profile_asked)
            next_profile = time.monotonic() + profile_every_s
            continue
        cycle += 1
        if cycle % 6 == 0:
            press("space", " ", "space (pause)", pausing)
            stop.wait(rng.uniform(0.2, 0.6))
            press("space", " ", "space (resume, while paused)", resumed)
        else:
            press("question_mark", "?", "? (help opens)", help_open)
            stop.wait(rng.uniform(0.2, 0.6))
            press("question_mark", "?", "? (help closes)", help_closed)


SMOKE_CONFIG: dict = {}  # --smoke: a tiny model, to check the script on a busy machine


async def in_process(seconds: float, profile_every_s: float, size: tuple[int, int],
                     seed: int, quiet_s: float) -> dict:
    """Part 1: quiet_s of training with `p` twice, then ``seconds`` of key presses; measured
    after step 20 with gc frozen. Returns the presses, lag ticks, spans and the CPU split."""
    from probes.runfolder import create_run_dir
    from trainer.config import TrainConfig
    from tui.app import MemtopApp

    with tempfile.TemporaryDirectory(prefix="memtop-lat-") as tmp:
        config = TrainConfig(device="cpu", steps=0, run_dir=tmp, **SMOKE_CONFIG)
        run_dir = create_run_dir(tmp)
        app = MemtopApp.for_run(config, run_dir)  # the defaults memtop train uses
        spans = Spans()
        spans.install(app)
        presses: list[dict] = []
        ticks: list[tuple[float, float, str]] = []
        async with app.run_test(size=size) as pilot:
            probe = Probe(app)
            t0 = time.monotonic()
            while app.trainer.status.step < 20 or not app.gc_frozen:
                await pilot.pause(0.1)
                if time.monotonic() - t0 > 300:
                    raise RuntimeError("the trainer did not start")
            stop_ticks = asyncio.Event()
            monitor = asyncio.create_task(lag_monitor(app, stop_ticks, ticks))
            stop = threading.Event()
            marks: dict[str, float] = {}
            thread = threading.Thread(target=injector, daemon=True,
                                      args=(app, probe, stop, presses, profile_every_s,
                                            random.Random(seed), quiet_s, marks))
            step0, t_start = app.trainer.status.step, time.perf_counter()
            busy0, mine0 = cpu_busy_s(), proc_cpu_s(os.getpid())
            thread.start()
            await asyncio.sleep(seconds + quiet_s)
            stop.set()
            while thread.is_alive():
                await asyncio.sleep(0.05)
            stop_ticks.set()
            await monitor
            steps = app.trainer.status.step - step0
            t_end = time.perf_counter()
            wall = t_end - t_start
            others = (cpu_busy_s() - busy0 - (proc_cpu_s(os.getpid()) - mine0)) / wall
            own = (proc_cpu_s(os.getpid()) - mine0) / wall
            prof = next((h for h in app.trainer.hooks if hasattr(h, "windows_done")), None)
            windows = prof.windows_done if prof is not None else 0
            await pilot.press("q")
            while app.return_code is None:
                await pilot.pause(0.1)
        app.shutdown()
        spans.uninstall()
        return {"presses": presses, "ticks": ticks, "steps": steps, "wall_s": wall,
                "spans": spans, "window": (t_start, t_end),
                "keys_start": marks.get("keys_start", t_end),
                "others_cores": max(0.0, others), "own_cores": own,
                "windows": windows, "frames": probe.frames, "encode_ms": probe.encode_ms}


# ---- part 2: tmux end to end -------------------------------------------------------------------

def in_tmux(presses: int, size: tuple[int, int], seed: int) -> dict:
    """Part 2: ``presses`` × (`?` opens help, `?` closes it), each timed until capture-pane
    shows the change (polled every 20 ms, 5 s at most: a miss)."""
    rng = random.Random(seed)
    lat: list[float] = []
    misses = 0
    with tempfile.TemporaryDirectory(prefix="memtop-lat-tmux-") as tmp:
        pane = TmuxPane(f"lat-{os.getpid()}", size[0], size[1], memtop_argv("--run-dir", tmp))
        try:
            t0 = time.monotonic()
            while screen_step(pane.capture()) < 20:
                time.sleep(0.5)
                if time.monotonic() - t0 > 300:
                    raise RuntimeError("the dashboard did not start in tmux")
            time.sleep(3)  # past the gc freeze
            marker = "memtop help"
            for i in range(presses * 2):
                want_visible = i % 2 == 0
                start = time.perf_counter()
                pane.send("?")
                seen = False
                while time.perf_counter() - start < 5:
                    if (marker in pane.capture()) == want_visible:
                        seen = True
                        break
                    time.sleep(0.020)
                if seen:
                    lat.append((time.perf_counter() - start) * 1000)
                else:
                    misses += 1
                time.sleep(rng.uniform(0.2, 0.6))
            pane.send("q")
            pane.wait_dead(120)
        finally:
            pane.kill()
            TmuxPane.kill_server()
    return {"lat": lat, "misses": misses}
