"""What the ui_latency case's part 1 measures with, inside the app's process: the frame probe (key
press -> the first compositor frame that shows its effect), the work spans (timed wrappers and
gc callbacks, to tell what each event-loop stall overlapped) and the lag monitor (how late a
10 ms asyncio sleep wakes on the app's loop), each split by the profiler's phase.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time

TICK_S = 0.010


def group_of(phases: tuple[str | None, str | None]) -> str:
    """no window / window (wait, warmup, active, the stop and export) / analysis."""
    if any(p == "analysing" for p in phases):
        return "analysis"
    if any(p for p in phases):
        return "window"
    return "no window"


GROUPS = ("no window", "window", "analysis")


class Probe:
    """Wraps App._display: each frame the compositor makes is timed and encoded; a pending key
    press is resolved by the first frame that shows its effect."""

    def __init__(self, app) -> None:
        self.app = app
        self.frames = 0
        self.encode_ms: list[float] = []
        self.pending: tuple[str, float, object] | None = None  # (label, t0, predicate)
        self.resolved = threading.Event()
        self.latency_ms: float | None = None
        original = app._display

        def display(screen, renderable) -> None:
            now = time.perf_counter()
            if renderable is not None:
                self.frames += 1
                render = getattr(renderable, "render_segments", None)
                if render is not None:  # what the Linux driver would write, minus the write
                    t = time.perf_counter()
                    render(app.console)
                    self.encode_ms.append((time.perf_counter() - t) * 1000)
                pending = self.pending
                if pending is not None and pending[2](screen):
                    self.latency_ms = (time.perf_counter() - pending[1]) * 1000
                    self.pending = None
                    self.resolved.set()
            original(screen, renderable)
            del now

        app._display = display


class Spans:
    """Intervals of known work (main-thread Textual/memtop work, gc pauses on any thread, the
    profiler's stop on the training thread), to tell what each event-loop stall overlapped.
    Each: (start, end, thread CPU ms or None, label)."""

    def __init__(self) -> None:
        self.items: list[tuple[float, float, float | None, str]] = []
        self._gc_start: dict[int, float] = {}
        self._undo: list = []

    def timed(self, fn, label_of):
        def wrapper(*args, **kwargs):
            t0, c0 = time.perf_counter(), time.thread_time()
            before = label_of(None)
            try:
                return fn(*args, **kwargs)
            finally:
                self.items.append((t0, time.perf_counter(),
                                   (time.thread_time() - c0) * 1000, label_of(before)))
        return wrapper

    def install(self, app) -> None:
        import gc

        from textual.screen import Screen

        chart_builds = lambda: app.chart.builds  # noqa: E731
        app.refresh_from_source = self.timed(
            app.refresh_from_source,
            lambda before: chart_builds() if before is None else
            ("refresh tick, chart rebuilt" if chart_builds() != before else "refresh tick"))
        for name, what in (("_compositor_refresh", "compositor"), ("_refresh_layout", "layout")):
            original = getattr(Screen, name)
            self._undo.append((Screen, name, original))

            def patched(screen, *a, _orig=original, _what=what, **kw):
                return self.timed(lambda: _orig(screen, *a, **kw),
                                  lambda b: f"{_what} ({type(screen).__name__})")()
            setattr(Screen, name, patched)
        hook = next((h for h in app.trainer.hooks if hasattr(h, "_finish_window")), None)
        if hook is not None:
            hook._finish_window = self.timed(
                hook._finish_window, lambda b: "profiler stop + trace export (training thread)")

        def on_gc(phase, info) -> None:
            # wall time from the start callback to the stop callback can include waiting for
            # the GIL (a callback is Python code: the trainer thread may take the GIL in
            # between); the CPU time of this thread meanwhile is the collection's own cost
            tid = threading.get_ident()
            now, cpu = time.perf_counter(), time.thread_time()
            if phase == "start":
                self._gc_start[tid] = (now, cpu)
            elif tid in self._gc_start:
                t0, c0 = self._gc_start.pop(tid)
                self.items.append((t0, now, (cpu - c0) * 1000,
                                   f"gc gen{info['generation']} "
                                   f"({threading.current_thread().name})"))
        gc.callbacks.append(on_gc)
        self._undo.append((gc, "callbacks", on_gc))

    def uninstall(self) -> None:
        for owner, name, value in self._undo:
            if owner is not None and name == "callbacks":
                owner.callbacks.remove(value)
            else:
                setattr(owner, name, value)
        self._undo.clear()

    def attribute(self, ticks: list, presses: list, min_ms: float = 50.0) -> dict[str, list]:
        """label -> lateness (ms) of the stalls over min_ms, each given to the recorded work that
        overlapped its wait most (a key press in flight only when no work was recorded)."""
        out: dict[str, list] = {}
        keys = [(p["t0"], p["t0"] + p["ms"] / 1000, None, f"key press in flight: {p['key']}")
                for p in presses if p.get("ms") is not None]
        for woke, late, _group in ticks:
            if late < min_ms:
                continue
            lo, hi = woke - late / 1000, woke
            best = "nothing recorded (GIL / CPU held elsewhere)"
            for pool in (self.items, keys):
                ov_best = 0.0
                for a, b, _cpu, label in pool:
                    ov = min(b, hi) - max(a, lo)
                    if ov > ov_best:
                        best, ov_best = label, ov
                if ov_best > 0:
                    break
            out.setdefault(best, []).append(late)
        return out

    def table(self, start: float, end: float) -> list[tuple[str, int, float, float, float]]:
        """label, n, median wall ms, median thread-CPU ms, max wall ms (within start..end)."""
        by: dict[str, list] = {}
        for a, b, cpu, label in self.items:
            if not start <= a <= end:
                continue
            by.setdefault(label, []).append(((b - a) * 1000, cpu))
        rows = []
        for label, vals in by.items():
            walls = [w for w, _ in vals]
            cpus = [c for _, c in vals if c is not None]
            rows.append((label, len(vals), statistics.median(walls),
                         statistics.median(cpus) if cpus else float("nan"), max(walls)))
        return sorted(rows, key=lambda r: -r[4])


async def lag_monitor(app, stop: asyncio.Event, ticks: list[tuple[float, float, str]]) -> None:
    """Until ``stop``: sleep TICK_S on the app's loop and record (woke, ms late, phase group);
    the longest lateness is the longest stall of the UI event loop."""
    while not stop.is_set():
        phase0 = app.trainer.status.profile_phase
        t0 = time.perf_counter()
        await asyncio.sleep(TICK_S)
        woke = time.perf_counter()
        ticks.append((woke, (woke - t0 - TICK_S) * 1000,
                      group_of((phase0, app.trainer.status.profile_phase))))
