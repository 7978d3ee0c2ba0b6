"""The live dashboard: panes, memory chart, top-ops table, leak banner and ledger over one run.

The trainer runs on its own thread and pushes StepSamples/Events into a bounded Ring; a 2 Hz
timer drains it and updates only what changed (DESIGN.md: 2 Hz kept ≥ 0.98 of the headless
throughput on 2 cores, 10 Hz full redraws halved it). The UI never calls torch. Running it on a
real terminal (fd 2, signals, the bounded shutdown) is tui/dashboard_run.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from textual import events, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.widgets import Footer

from probes.ring import Ring
from probes.sample import Event, StepSample
from trainer.config import TrainConfig
from trainer.control import TrainControl
from trainer.loop import Record, Trainer
from tui.format import (
    PANE_KINDS,
    fit,
    header_text,
    leak_demo_text,
    pane_labels,
    profile_text,
    sample_values,
    state_text,
)
from tui.format_panels import counter_pane
from tui.run_end import RunEnd
from tui.widgets.error_banner import ErrorBanner
from tui.widgets.header import MemtopHeader
from tui.widgets.help_screen import HelpScreen
from tui.widgets.leak_banner import LeakBanner
from tui.widgets.ledger import LedgerPane
from tui.widgets.memory_chart import MemoryChart
from tui.widgets.metric_pane import MetricPane
from tui.widgets.status_line import StatusLine
from tui.widgets.top_ops import TopOpsTable

REFRESH_S = 0.5  # 2 Hz: the rate DESIGN.md measured at 0.98 of headless throughput
CHART_EVERY_S = 5.0  # plotext rebuilds cost ~30 ms: rarely
VIEWS = ("chart", "ops", "ledger")


class MemtopApp(App[int]):
    """One run's dashboard. Build with :meth:`for_run`; tests may pass their own parts."""

    CSS_PATH = "memtop.tcss"
    TITLE = "memtop"
    ENABLE_COMMAND_PALETTE = False
    AUTO_FOCUS = None  # keys go to the app; Tab reaches the top-ops table when wanted
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-tall")]
    BINDINGS = [
        Binding("p", "profile", "profile"),
        Binding("l", "leak", "leak"),
        Binding("space", "pause", "pause"),
        Binding("r", "report", "report"),
        Binding("s", "screenshot", "svg"),
        Binding("o", "sort", "sort"),
        Binding("v", "view", "view"),
        Binding("question_mark", "help", "help"),
        Binding("q", "request_quit", "quit"),
        Binding("ctrl+q", "request_quit", "quit", show=False, priority=True),
        Binding("ctrl+c", "request_quit", "quit", show=False, priority=True),
    ]

    def __init__(self, config: TrainConfig, run_dir: Path, trainer: Trainer,
                 control: TrainControl, ring: Ring[Record], *, refresh_s: float = REFRESH_S,
                 chart_every_s: float = CHART_EVERY_S, autostart: bool = True,
                 freeze_gc: bool = True) -> None:
        super().__init__()
        self.config = config
        self.run_dir = Path(run_dir)
        self.trainer = trainer
        self.control = control
        self.ring = ring
        self.refresh_s = refresh_s
        self.chart_every_s = chart_every_s
        self.autostart = autostart
        self.freeze_gc = freeze_gc
        self.device_type = config.torch_device.type
        self.profiler_available = any(hasattr(h, "request") for h in trainer.hooks)
        self.last_sample: StepSample | None = None
        self.ending = RunEnd(trainer, control, self.run_dir)  # stop, join, report: once
        self.ticks = 0
        self.view = "chart"
        self.counters: str | None = None
        self._gc_frozen = False
        self._quitting = False
        self._quit_forced = False
        self._profile_requested = False
        self._leak_toggling = False
        self._leak_kind = config.leak
        self._leak_since: int | None = None
        self._ended_elapsed: float | None = None
        self._alert_panes: dict[str, str] = {}  # counter -> pane id
        self._loop: asyncio.AbstractEventLoop | None = None  # set on mount; for other threads
        self.quit_signal: int | None = None  # SIGTERM/SIGHUP that asked for the quit
        self._early_signal: int | None = None  # one that came before the loop was running
        self._screenshots = 0

    @classmethod
    def for_run(cls, config: TrainConfig, run_dir: Path, **kwargs: Any) -> MemtopApp:
        """The real wiring: control + ring sink + trainer with the configured instruments."""
        from trainer.instruments import build_hooks

        control = TrainControl()
        ring: Ring[Record] = Ring(maxlen=4096)
        trainer = Trainer(config, run_dir, control, sinks=[ring.push], hooks=build_hooks(config))
        return cls(config, run_dir, trainer, control, ring, **kwargs)

    # layout ------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        labels = pane_labels(self.device_type)
        short = pane_labels(self.device_type, short=True)
        yield MemtopHeader(id="header")
        yield ErrorBanner(id="error")
        yield LeakBanner(id="leak")
        with Grid(id="panes"):
            for pane_id, kind in PANE_KINDS.items():
                yield MetricPane(pane_id, labels[pane_id], kind, short[pane_id])
        with Horizontal(id="lower", classes="view-chart"):
            with Vertical(id="chart-box"):
                yield MemoryChart((labels["allocated"], labels["reserved"], labels["peak"]),
                                  every_s=self.chart_every_s, id="chart")
            with Vertical(id="side"):
                yield TopOpsTable(id="ops")
                yield LedgerPane(id="ledger")
        yield StatusLine(id="status")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.query_one("#chart-box").border_title = "memory over recent steps"
        self.panes = {p.pane_id: p for p in self.query(MetricPane)}
        self.header_bar = self.query_one(MemtopHeader)
        self.status_line = self.query_one(StatusLine)
        self.leak_banner = self.query_one(LeakBanner)
        self.error_banner = self.query_one(ErrorBanner)
        self.chart = self.query_one(MemoryChart)
        self.ops_table = self.query_one(TopOpsTable)
        self.ledger = self.query_one(LedgerPane)
        if self.config.amp_mode != "fp16":
            self.panes["scale"].set_note(f"not needed ({self.config.amp_mode})")
        # Python-level print()/warnings while the app runs: Textual captures and drops them;
        # keep them in the run's stderr.log (fd 2 while run_dashboard owns the terminal).
        self.begin_capture_print(self, stdout=True, stderr=True)
        if self.autostart:
            self.trainer.start()  # the model is built on the trainer thread
        self.set_interval(self.refresh_s, self.refresh_from_ring)
        self.refresh_from_ring()
        if self._early_signal is not None:
            self.call_later(self._quit_for_signal, self._early_signal)

    def on_unmount(self) -> None:
        """However the app goes away, the trainer stops at its next step boundary."""
        self.control.stop()

    def on_print(self, event: events.Print) -> None:
        if self.is_headless:
            return  # run_test: Textual already passes prints on to the real streams
        with contextlib.suppress(OSError):
            os.write(2, event.text.encode("utf-8", "replace"))

    # the refresh -------------------------------------------------------------------------------
    def refresh_from_ring(self) -> None:
        """Drain what the trainer produced since the last tick and redraw what changed."""
        self.ticks += 1
        samples: list[StepSample] = []
        for record in self.ring.drain():
            if isinstance(record, StepSample):
                samples.append(record)
            else:
                self.handle_event(record)
        if samples:
            self._take_samples(samples)
        for pane in self.panes.values():
            pane.refresh_view()
        self.redraw_chart(force=False)
        self.update_header()
        self.update_status()
        self.leak_banner.tick()
        self._check_failed()
        self._maybe_freeze_gc()

    def _take_samples(self, samples: list[StepSample]) -> None:
        rows = [sample_values(s) for s in samples]
        for pane_id, pane in self.panes.items():
            pane.push([row[pane_id] for row in rows])
        last = samples[-1]
        self.last_sample = last
        if last.scale is not None:
            self.panes["scale"].set_note(f"skipped steps {last.skipped_steps}")
        self.chart.add_points(samples)

    def redraw_chart(self, force: bool = True) -> None:
        """Bring the chart up to date (every ~5 s on the timer; at once for a screenshot)."""
        peak = self.last_sample.peak_allocated_bytes if self.last_sample else None
        self.chart.maybe_redraw(peak, force=force)

    def _maybe_freeze_gc(self) -> None:
        """Once the model is built: collect, then freeze, so gen-2 passes stop walking torch's and
        Textual's ~200k long-lived objects (a ~100 ms GIL hold each, DESIGN.md)."""
        if self.freeze_gc and not self._gc_frozen and self.trainer.status.state != "starting":
            gc.collect()
            gc.freeze()
            self._gc_frozen = True

    def update_header(self) -> None:
        st = self.trainer.status
        state = state_text(st.state, st.profile_phase, self.control.paused, self._quitting)
        if st.state in ("stopped", "failed") or (self.autostart and not self.trainer.alive
                                                 and st.state != "starting"):
            if self._ended_elapsed is None:
                self._ended_elapsed = self.last_sample.time_s if self.last_sample else 0.0
            elapsed = self._ended_elapsed
        else:
            elapsed = self.trainer.elapsed_s() if self.trainer.alive else 0.0
        text = header_text(
            device_name=st.device_name, device_total=st.device_total_bytes,
            amp=self.config.amp_mode, batch=self.config.batch_size, seq=self.config.seq_len,
            params=st.params or None, step=st.step, elapsed_s=elapsed, state=state,
            width=self.header_bar.size.width or self.size.width or 80)
        self.header_bar.show(text, state)

    def update_status(self) -> None:
        st = self.trainer.status
        parts = [
            profile_text(st.profile_phase, self._profile_requested, self.profiler_available),
            leak_demo_text(self._leak_kind, st.leak_active, self._leak_since,
                           self._leak_toggling),
        ]
        if st.state in ("stopped", "failed"):
            parts.append(f"{st.state}: {st.stop_reason or st.error or '?'} (q quits)")
        elif self._quitting:
            parts.append("stopping: waiting for the step to end…")
        if self.ring.dropped:
            parts.append(f"{self.ring.dropped} records dropped")
        parts.append(f"run {self.run_dir}")
        width = self.status_line.size.width or self.size.width or 80
        self.status_line.show(fit(" " + " │ ".join(parts), width))

    def _check_failed(self) -> None:
        st = self.trainer.status
        if st.state == "failed" and not self.error_banner.shown:
            self.error_banner.show_message(f"TRAINING FAILED at step {st.step}: {st.error}\n"
                                           "the last samples stay on screen; q quits")

    # events ------------------------------------------------------------------------------------
    def handle_event(self, event: Event) -> None:
        """One Event from the trainer (or a test): route it to the widget that shows it."""
        d = event.data
        name = event.event
        if name == "run_started":
            self.counters = d.get("counters")
        elif name == "leak_suspected":
            self.leak_banner.suspected(event.step, d)
            pane = counter_pane(str(d.get("counter")), self.device_type)
            if pane is not None:
                self._alert_panes[str(d.get("counter"))] = pane
                self.panes[pane].set_class(True, "-alert")
        elif name == "leak_cleared":
            self.leak_banner.cleared(event.step, d)
            pane = self._alert_panes.pop(str(d.get("counter")), None)
            if pane is not None and pane not in self._alert_panes.values():
                self.panes[pane].set_class(False, "-alert")
        elif name == "profile_started":
            self._profile_requested = False
        elif name == "profile_cancelled":
            self._profile_requested = False
            self.ops_table.set_note("profiler window cancelled; press p to open a new one")
            self.notify("profiler window cancelled", timeout=3)
        elif name == "profile_done":
            self._profile_requested = False
            self.ops_table.show_window(event.step, d)
            if self.size.width < 100:  # narrow: the table takes the chart's place
                self.set_view("ops")
            self.notify(f"top ops ready (step {event.step}); o changes the sort", timeout=4)
        elif name == "ledger":
            self.ledger.show_ledger(d)
        elif name == "leak_demo_started":
            self._leak_toggling = False
            self._leak_kind = d.get("kind", self._leak_kind)
            self._leak_since = event.step
        elif name == "leak_demo_stopped":
            self._leak_toggling = False
            self._leak_since = None
            self.notify(f"leak demo stopped: released {d.get('released_tensors', '?')} tensors",
                        timeout=4)
        elif name == "error":
            self.error_banner.show_message(
                f"TRAINING FAILED at step {event.step}: {d.get('error_type', 'Error')}: "
                f"{d.get('message', '')}\nthe last samples stay on screen; the traceback is in "
                f"{self.run_dir / 'metrics.jsonl'}; q quits")
        elif name == "memory_guard":
            self.error_banner.show_message(
                f"memory guard stopped the run at step {event.step}: {d.get('counter')} would "
                f"pass the --max-memory limit", warning=True)

    # keys --------------------------------------------------------------------------------------
    def _run_over(self) -> bool:
        if self.trainer.status.state in ("stopped", "failed"):
            self.notify("the run has ended: q quits", timeout=3)
            return True
        return False

    def action_profile(self) -> None:
        if self._run_over():
            return
        if not self.profiler_available:
            self.notify("no profiler window in this build", severity="warning", timeout=3)
            return
        self.control.request_profile()
        if self.trainer.status.profile_phase is None:
            self._profile_requested = True
        self.update_status()

    def action_leak(self) -> None:
        if self._run_over():
            return
        self.control.toggle_leak()
        self._leak_toggling = True
        self.update_status()

    def action_pause(self) -> None:
        if self._run_over():
            return
        self.control.toggle_pause()
        self.update_header()

    def action_sort(self) -> None:
        title = self.ops_table.cycle_sort()
        if title is None:
            self.notify("no top-ops table yet: press p first", timeout=3)

    def action_view(self) -> None:
        self.set_view(VIEWS[(VIEWS.index(self.view) + 1) % len(VIEWS)])

    def set_view(self, view: str) -> None:
        """Which of chart / top ops / ledger fills the lower area on narrow terminals."""
        lower = self.query_one("#lower")
        lower.set_class(False, f"view-{self.view}")
        self.view = view
        lower.set_class(True, f"view-{view}")

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.device_type, self.counters))

    def action_screenshot(self) -> None:
        """An SVG into the run folder; the counter keeps two presses in one second apart."""
        self._screenshots += 1
        step = self.trainer.status.step
        name = (f"screenshot-{self._screenshots:03d}-step{step:06d}-"
                f"{time.strftime('%H%M%S')}.svg")
        try:
            path = self.save_screenshot(filename=name, path=str(self.run_dir))
        except OSError as exc:  # disk full, read-only folder: the dashboard stays up
            self.notify(f"screenshot not saved: {exc.strerror or exc}", severity="error",
                        timeout=6)
            return
        self.notify(f"saved {path}", timeout=4)

    def action_report(self) -> None:
        self.notify("writing the report…", timeout=2)
        self._report_worker()

    @work(thread=True, group="report", exclusive=True, exit_on_error=False)
    def _report_worker(self) -> None:
        """Off the event loop; probes.report serialises writers (`r` twice, `r` then `q`)."""
        from probes.report import write_report

        try:
            path = write_report(self.run_dir)
        except Exception as exc:  # the dashboard must survive a report bug
            self.call_from_thread(self.notify, f"report failed: {exc}", severity="error")
            return
        self.ending.report_path = Path(path)
        self.call_from_thread(self.notify, f"report written: {path}", timeout=6)

    def action_request_quit(self) -> None:
        self.request_quit("stopped by user")

    def request_quit(self, reason: str) -> None:
        """Stop at the next step boundary, join off the event loop, write the report, exit.

        A second request while a long step runs leaves at once; shutdown() then waits, bounded.
        """
        if self._quitting:
            if not self._quit_forced:
                self._quit_forced = True
                code = self.exit_code()
                self.exit(code, return_code=code)
            return
        self._quitting = True
        self.ending.stop_in_background(reason, then=lambda: self._on_loop(self._exit_after_quit))
        self.update_header()
        self.update_status()

    def _exit_after_quit(self) -> None:
        if not self._quit_forced:
            code = self.exit_code()
            self.exit(code, return_code=code)

    def _on_loop(self, callback: Callable[..., Any], *args: Any) -> None:
        """Run ``callback`` on the app's message pump, from any thread or a signal handler.

        call_soon_threadsafe only appends to the loop's queue and wakes its selector (safe
        between two bytecodes of the main thread); call_later then runs the callback inside
        Textual's context. Nothing happens once the loop has closed.
        """
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self.call_later, callback, *args)

    def signal_quit(self, signum: int) -> None:
        """For a SIGTERM/SIGHUP handler: ask for the same clean quit as `q` (twice: at once)."""
        if self.quit_signal is None:
            self.quit_signal = signum
        if self._loop is None:
            self._early_signal = signum  # on_mount acts on it
        else:
            self._on_loop(self._quit_for_signal, signum)

    def _quit_for_signal(self, signum: int) -> None:
        self.request_quit(f"interrupted ({signal.Signals(signum).name})")

    @property
    def finished(self) -> bool:
        return self.ending.finished

    @property
    def report_path(self) -> Path | None:
        return self.ending.report_path

    def exit_code(self) -> int:
        return self.ending.exit_code()

    def shutdown(self, timeout_s: float = 10.0, out: TextIO | None = None) -> None:
        """After the app has gone (whatever the way): stop and join the trainer, finish the run."""
        self.ending.shutdown(timeout_s, out)
        if self._gc_frozen:
            gc.unfreeze()
            self._gc_frozen = False

