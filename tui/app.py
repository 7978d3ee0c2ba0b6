"""The dashboard: panes, memory chart, top-ops table, leak banner and ledger over one run.

It reads a run source (tui/sources.py): memtop's trainer on a thread of this process, or a run
folder another process writes (or wrote). A 2 Hz timer polls the source and updates only what
changed (docs/ARCHITECTURE.md: 2 Hz kept ≥ 0.98 of the headless throughput on 2 cores, 10 Hz full
redraws halved it). The UI never calls torch. Keys and quitting are tui/app_actions.py; running on a
real terminal (fd 2, signals, the bounded shutdown) is tui/dashboard_run.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical

from probes import records as R
from probes.records import Event, Record, StepSample, switches_text
from probes.runfolder.state import RunState
from probes.tools.ring import Ring
from tui.app_actions import AppActions
from tui.app_ranks import RanksView
from tui.format import (
    PANE_KINDS,
    cuda_notes,
    fit,
    header_text,
    leak_demo_text,
    pane_labels,
    profile_text,
    sample_values,
    state_text,
    throughput_label,
)
from tui.format_panels import counter_pane
from tui.run_end import RunEnd
from tui.sources import DeferredTrainer, FolderSource, RunSource, TrainerSource
from tui.widgets.admission_line import AdmissionLine
from tui.widgets.baseline_bar import BaselineBar
from tui.widgets.error_banner import ErrorBanner
from tui.widgets.footer import MemtopFooter
from tui.widgets.header import MemtopHeader
from tui.widgets.kv_cache import KvCachePane
from tui.widgets.leak_banner import LeakBanner
from tui.widgets.ledger import LedgerPane
from tui.widgets.memory_chart import MemoryChart
from tui.widgets.metric_pane import MetricPane
from tui.widgets.phase_throughput import PhaseThroughputPane
from tui.widgets.rank_table import RankTable
from tui.widgets.status_line import StatusLine
from tui.widgets.top_ops import TopOpsTable

if TYPE_CHECKING:
    from probes.analysis.baseline import BaselineWatch

REFRESH_S = 0.5  # 2 Hz: the rate docs/ARCHITECTURE.md records at 0.98 of headless throughput
CHART_EVERY_S = 5.0  # plotext rebuilds cost ~30 ms: rarely
VIEWS = ("chart", "ops", "ledger")
FIRST_SAMPLE_POLL_S = 0.05  # until the first sample: startup target is the bare floor + 0.2 s
GEN2_EVERY = 100  # gen-1 passes between gen-2 passes once frozen (CPython's default: 10)


class MemtopApp(RanksView, AppActions, App[int]):
    """One run's dashboard. Build with :meth:`for_run` (train) or :meth:`for_folder` (view)."""

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
        Binding("x", "stop_run", "stop run", show=False),
        Binding("m", "snapshot", "snapshot", show=False),
        Binding("question_mark", "help", "help"),
        Binding("q", "request_quit", "quit"),
        Binding("ctrl+q", "request_quit", "quit", show=False, priority=True),
        Binding("ctrl+c", "request_quit", "quit", show=False, priority=True),
    ]

    def __init__(self, source: RunSource, *, ending: RunEnd | None = None,
                 refresh_s: float = REFRESH_S, chart_every_s: float = CHART_EVERY_S,
                 freeze_gc: bool = True, device_type: str = "cpu") -> None:
        super().__init__()
        self.source = source
        self.run_dir = Path(source.run_dir)
        self.config: dict[str, Any] = source.config
        self.ending = ending  # memtop train: stops and joins the trainer, writes the report
        self.refresh_s = refresh_s
        self.chart_every_s = chart_every_s
        self.freeze_gc = freeze_gc
        self.device_type = device_type
        self.run_state = RunState()  # folded from every record the source gave
        self.last_sample: StepSample | None = None
        self.ticks = 0
        self._gc_frozen = False
        self._gc_thresholds: tuple[int, int, int] | None = None
        self._alert_panes: dict[str, str] = {}  # counter -> pane id
        self._loop: asyncio.AbstractEventLoop | None = None  # set on mount; for other threads
        # several ranks: the panes and chart follow rank 0, the rank table every rank
        self.ranks_mode = getattr(source, "expected_ranks", 1) > 1 or len(
            getattr(source, "followers", {})) > 1
        self.views = VIEWS + (("ranks",) if self.ranks_mode else ())
        self._failure_shown = False
        self.view = "ranks" if self.ranks_mode else "chart"
        self.baseline: BaselineWatch | None = None  # `--baseline RUN`, from config.json
        if isinstance(self.config.get("baseline"), str) and self.config["baseline"]:
            from probes.analysis.baseline import (
                BaselineWatch,  # only with --baseline: it loads a run
            )

            warmup = self.config.get("warmup_steps")
            self.baseline = BaselineWatch(self.config["baseline"],
                                          warmup if isinstance(warmup, int) else 0)
        self._init_actions()

    @classmethod
    def for_run(cls, config: Any, run_dir: Path, autostart: bool = True, deferred: bool = False,
                **kwargs: Any) -> MemtopApp:
        """`memtop train`: the trainer with its instruments on a thread, records via a ring.

        ``deferred``: build the trainer (and import torch) on its thread once started, so the
        frame is on screen first (tui/sources.py DeferredTrainer); the device is then learnt
        from the run_started row."""
        ring: Ring[Record] = Ring(maxlen=4096)
        trainer: Any
        if deferred:
            trainer = DeferredTrainer(config, run_dir, sinks=[ring.push])
            device = str(config.device).strip().lower()
            kwargs.setdefault("device_type", "cuda" if device.startswith("cuda") else "cpu")
        else:
            from probes.monitor import default_hooks
            from trainer.loop import Trainer

            trainer = Trainer(config, run_dir, sinks=[ring.push],
                              hooks=default_hooks(**config.hook_options()))
            kwargs.setdefault("device_type", config.torch_device.type)
        source = TrainerSource(trainer, ring)
        source.autostart = autostart
        ending = RunEnd(trainer, trainer.control, Path(run_dir))
        return cls(source, ending=ending, **kwargs)

    @classmethod
    def for_infer(cls, config: Any, spec: Any, run_dir: Path, **kwargs: Any) -> MemtopApp:
        """`memtop infer`: the inference runner on a thread, records via a ring."""
        from trainer.infer import InferenceRunner

        ring: Ring[Record] = Ring(maxlen=4096)
        runner = InferenceRunner(config, spec, run_dir, sinks=[ring.push])
        source = TrainerSource(runner, ring)
        source.config = runner.config_json
        ending = RunEnd(runner, runner.control, Path(run_dir))  # type: ignore[arg-type]
        return cls(source, ending=ending, device_type=config.torch_device.type, **kwargs)

    @property
    def is_infer(self) -> bool:
        return self.config.get("mode") == "infer"

    @property
    def _what(self) -> str:
        return "INFERENCE" if self.is_infer else "TRAINING"

    @classmethod
    def for_folder(cls, path: str | os.PathLike[str], **kwargs: Any) -> MemtopApp:
        """`memtop view`: a run folder, followed while another process writes it."""
        source = FolderSource(path)
        source.start()
        started = next((r for r in source.history()[0]
                        if isinstance(r, Event) and r.event == R.RUN_STARTED), None)
        device = str(started.data.get("device", "cpu")) if started else "cpu"
        return cls(source, device_type="cuda" if device.startswith("cuda") else "cpu", **kwargs)

    # the parts tests and the actions reach -----------------------------------------------------
    @property
    def trainer(self) -> Any:
        return self.source.trainer if isinstance(self.source, TrainerSource) else None

    @property
    def control(self) -> Any:
        return self.source.control if isinstance(self.source, TrainerSource) else None

    @property
    def ring(self) -> Ring[Record] | None:
        return self.source.ring if isinstance(self.source, TrainerSource) else None

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
        if self.is_infer:  # the inference ledger (docs/INFERENCE.md): cache, phases, admission
            with Vertical(id="infer"):
                with Horizontal(id="infer-panes"):
                    yield KvCachePane(self.config.get("block_size"), id="kv")
                    yield PhaseThroughputPane(id="phases")
                yield AdmissionLine(id="admission")
        with Horizontal(id="lower", classes=f"view-{self.view}"):
            yield RankTable(id="ranks")
            with Vertical(id="chart-box"):
                yield MemoryChart((labels["allocated"], labels["reserved"], labels["peak"]),
                                  every_s=self.chart_every_s, id="chart")
            with Vertical(id="side"):
                yield TopOpsTable(id="ops")
                yield LedgerPane(id="ledger")
        yield BaselineBar(id="baseline")
        yield StatusLine(id="status")
        yield MemtopFooter(compact=True)

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
        self.rank_table = self.query_one(RankTable)
        self.infer_panes: list[Any] = list(self.query(KvCachePane)) + list(
            self.query(PhaseThroughputPane))
        self.admission = next(iter(self.query(AdmissionLine)), None)
        self.baseline_bar = self.query_one(BaselineBar)
        # Python-level print()/warnings while the app runs: Textual captures and drops them;
        # keep them in the run's stderr.log (fd 2 while run_dashboard owns the terminal).
        self.begin_capture_print(self, stdout=True, stderr=True)
        self._load_history()
        # after the first frame is composed: the trainer thread's `import torch` holds the GIL
        # for seconds and would otherwise delay it (benchmarks/RESULTS.md, "Startup")
        self.call_after_refresh(self.source.start)
        self.set_interval(self.refresh_s, self.refresh_from_source)
        self.refresh_from_source()
        if self.ring is not None:  # the first sample on screen at once, not at the next tick
            self._first_sample_timer = self.set_interval(FIRST_SAMPLE_POLL_S,
                                                         self._poll_first_sample)
        self._mounted_actions()

    def on_unmount(self) -> None:
        """However the app goes away, an in-process trainer stops at its next boundary."""
        if self.ending is not None:
            self.ending.control.stop()
        self.source.close()

    def on_print(self, event: events.Print) -> None:
        if self.is_headless:
            return  # run_test: Textual already passes prints on to the real streams
        with contextlib.suppress(OSError):
            os.write(2, event.text.encode("utf-8", "replace"))

    # the refresh -------------------------------------------------------------------------------
    def _load_history(self) -> None:
        """A run opened after it started: its past, the chart over the whole run."""
        records, chart = self.source.history()
        if records:
            self._take(records)
        if self.ranks_mode:
            chart = [s for s in chart if s.rank == 0]
        if chart:
            self.chart.points.clear()
            self.chart.add_points(chart)

    def refresh_from_source(self) -> None:
        """Take what the source has since the last tick and redraw what changed."""
        self.ticks += 1
        records = self.source.poll()
        if records:
            self._take(records)
        for pane in [*self.panes.values(), *self.infer_panes]:
            pane.refresh_view()
        if self.ranks_mode:
            self.rank_table.refresh_view()
        self.redraw_chart(force=False)
        self.update_header()
        self.update_status()
        self.update_baseline()
        self.leak_banner.tick()
        self._check_failed()
        self._maybe_freeze_gc()

    def _poll_first_sample(self) -> None:
        """Until the first sample is shown: a len() per poll, a refresh once records wait."""
        if self.last_sample is not None or self.run_state.finished:
            self._first_sample_timer.stop()
        elif self.ring is not None and len(self.ring):
            self.refresh_from_source()

    def _take(self, records: list[Record]) -> None:
        samples: list[StepSample] = []
        for record in records:
            if self.ranks_mode:
                self._take_rank(record)
                if record.rank != 0:
                    continue
            self.run_state.apply(record)
            if isinstance(record, StepSample):
                samples.append(record)
            else:
                self.handle_event(record)
        if samples:
            self._take_samples(samples)

    def _take_samples(self, samples: list[StepSample]) -> None:
        rows = [sample_values(s) for s in samples]
        for pane_id, pane in self.panes.items():
            pane.push([row[pane_id] for row in rows])
        last = samples[-1]
        self.last_sample = last
        if last.scale is not None:
            self.panes["scale"].set_note(f"skipped steps {last.skipped_steps}")
        for pane_id, note in cuda_notes(last).items():  # None on CPU: the range line stays
            self.panes[pane_id].set_note(note)
        label = throughput_label(last)
        if label != self.panes["tokens"].label:
            self.panes["tokens"].relabel(label, label)
        self.chart.add_points(samples)
        for infer_pane in self.infer_panes:
            infer_pane.push(samples)
        if self.baseline is not None:
            for s in samples:
                self.baseline.push(s)

    def update_baseline(self) -> None:
        """The `--baseline RUN` line (tutorial exercise 8), when the run names one."""
        from tui.format_panels import baseline_text

        watch = self.baseline
        if watch is None:
            return
        if watch.base is None:
            self.baseline_bar.show(f"{watch.error}")
            return
        now, change = watch.now()
        width = (self.baseline_bar.size.width or self.size.width or 80) - 2
        self.baseline_bar.show(baseline_text(watch.name, watch.base, now, change, width))

    def redraw_chart(self, force: bool = True) -> None:
        """Bring the chart up to date (every ~5 s on the timer; at once for a screenshot)."""
        peak = self.last_sample.peak_allocated_bytes if self.last_sample else None
        self.chart.maybe_redraw(peak, force=force)

    def _maybe_freeze_gc(self) -> None:
        """Once the run has started: collect, then freeze, so gen-2 passes stop walking
        torch's and Textual's ~200k long-lived objects (a ~100 ms GIL hold each,
        docs/ARCHITECTURE.md), as the trainer does (trainer/loop.py). After a freeze CPython
        counts almost nothing as long lived, so its 25% rule lets a gen-2 pass run at every 10th
        gen-1 pass (~0.6/s on the UI thread, benchmarks/RESULTS.md); GEN2_EVERY gen-1 passes
        space them out (undone at shutdown)."""
        if self.freeze_gc and not self._gc_frozen and self.run_state.state != "starting":
            gc.collect()
            gc.freeze()
            self._gc_thresholds = gc.get_threshold()
            t0, t1, t2 = self._gc_thresholds
            gc.set_threshold(t0, t1, max(t2, GEN2_EVERY))
            self._gc_frozen = True

    def elapsed_s(self) -> float:
        trainer = self.trainer
        if trainer is not None and trainer.alive and not self.run_state.finished:
            return trainer.elapsed_s()
        return self.last_sample.time_s if self.last_sample else self.run_state.time_s

    def update_header(self) -> None:
        st = self.run_state
        want_paused = self._pause_pending == "pause" or (
            st.state == "paused" and self._pause_pending != "resume")
        state = state_text(st.state, st.profile_phase, want_paused, self._quitting)
        batch, seq = self.config.get("batch_size"), self.config.get("seq_len")
        switches = None
        if self.is_infer:
            seq = (self.config.get("prompt_len") or 0) + (self.config.get("new_tokens") or 0)
            switches = switches_text((st.started or {}).get("switches"), short=True)
        text = header_text(
            device_name=st.device_name, device_total=st.device_total_bytes, switches=switches,
            amp=st.amp or "…", batch=batch, seq=seq, params=st.params or None, step=st.step,
            elapsed_s=self.elapsed_s(), state=state,
            width=self.header_bar.size.width or self.size.width or 80)
        self.header_bar.show(text, state)

    def update_status(self) -> None:
        st = self.run_state
        parts = [
            profile_text(st.profile_phase, self._profile_requested, self.can("profile")),
            leak_demo_text(st.leak_kind or self.config.get("leak"), st.leak_active,
                           st.leak_since, self._leak_toggling, self.can("leak_start")),
        ]
        if st.finished or st.state == "failed":
            reason = st.error or st.stop_reason or "?"
            word = "failed" if st.state == "failed" else "finished"
            parts.append(f"{word} at step {st.step}: {reason}"
                         if word == "failed" else f"{word} at step {st.step} ({reason})")
        elif self._quitting:
            parts.append("stopping: waiting for the step to end…")
        note = self.source.note
        if note:
            parts.append(note)
        if self.ranks_mode:
            parts.append(f"{len(self.rank_table.rows)} ranks")
        if not self.source.in_process and self.ending is None:
            parts.append("viewing" + ("" if self.source.live else " (not live)"))
        parts.append(f"run {self.run_dir}")
        width = self.status_line.size.width or self.size.width or 80
        self.status_line.show(fit(" " + " │ ".join(parts), width))

    def _check_failed(self) -> None:
        self._show_rank_failure()
        st = self.run_state
        if st.state == "failed" and not self.error_banner.shown:
            self.error_banner.show_message(f"{self._what} FAILED at step {st.step}: {st.error}\n"
                                           "the last samples stay on screen; q quits")
        build_error = getattr(self.trainer, "build_error", None)
        if build_error and not self.error_banner.shown:
            self.error_banner.show_message(f"the trainer could not start: {build_error}\nq quits")

    # events ------------------------------------------------------------------------------------
    def handle_event(self, event: Event) -> None:
        """One Event from the run: route it to the widget that shows it."""
        d = event.data
        name = event.event
        if name == R.RUN_STARTED:
            device = str(d.get("device") or "cpu")
            self.relabel("cuda" if device.startswith("cuda") else "cpu")
            amp = str(d.get("amp") or "")
            if amp and amp not in ("fp16", "auto"):
                self.panes["scale"].set_note(f"not needed ({amp})")
            if d.get("mode") == "infer":
                self.panes["scale"].set_note("none: inference")
                self.panes["loss"].set_note("none: inference")
                self.ledger.set_placeholder("inference: no training ledger; the KV cache pane "
                                            "and the admission line above are its ledger")
        elif name == R.ADMISSION and self.admission is not None:
            self.admission.show(d)
        elif name == R.LEAK_SUSPECTED:
            self.leak_banner.suspected(event.step, d)
            pane = counter_pane(str(d.get("counter")), self.device_type)
            if pane is not None:
                self._alert_panes[str(d.get("counter"))] = pane
                self.panes[pane].set_class(True, "-alert")
        elif name == R.LEAK_CLEARED:
            self.leak_banner.cleared(event.step, d)
            pane = self._alert_panes.pop(str(d.get("counter")), None)
            if pane is not None and pane not in self._alert_panes.values():
                self.panes[pane].set_class(False, "-alert")
        elif name == R.PROFILE_STARTED:
            self._profile_requested = False
        elif name == R.PROFILE_CANCELLED:
            self._profile_requested = False
            self.ops_table.set_note("profiler window cancelled; press p to open a new one")
            self.notify(f"profiler window cancelled: {d.get('reason', '')}", timeout=3)
        elif name == R.PROFILE_DONE:
            self._profile_requested = False
            self.ops_table.show_window(event.step, d)
            if self.size.width < 100:  # narrow: the table takes the chart's place
                self.set_view("ops")
            self.notify(f"top ops ready (step {event.step}); o changes the sort", timeout=4)
        elif name == R.LEDGER:
            self.ledger.show_ledger(d)
        elif name == R.LEAK_DEMO_STARTED:
            self._leak_toggling = False
        elif name == R.LEAK_DEMO_STOPPED:
            self._leak_toggling = False
            self.notify(f"leak demo stopped: released {d.get('released_tensors', '?')} tensors",
                        timeout=4)
        elif name in (R.PAUSED, R.RESUMED):
            self._pause_pending = None
        elif name == R.ERROR:
            self.error_banner.show_message(
                f"{self._what} FAILED at step {event.step}: {d.get('error_type', 'Error')}: "
                f"{d.get('message', '')}\nthe last samples stay on screen; the traceback is in "
                f"{self.run_dir / 'metrics.jsonl'}; q quits")
        elif name == R.MEMORY_SNAPSHOT:
            self.notify(f"memory snapshot: {event.summary()}", timeout=6,
                        severity="error" if d.get("error") else "information")
        elif name == R.HINT:  # each kind once a run (probes/instruments/hints.py): a long toast
            self.notify(f"{d.get('title')}: {d.get('why')}", title="hint", timeout=10)
        elif name == R.MEMORY_GUARD:
            self.error_banner.show_message(
                f"memory guard stopped the run at step {event.step}: {d.get('counter')} would "
                f"pass the --max-memory limit", warning=True)

    def relabel(self, device_type: str) -> None:
        """Pane labels say what the counters are on this device (a viewer learns it late)."""
        if device_type == self.device_type:
            return
        self.device_type = device_type
        labels, short = pane_labels(device_type), pane_labels(device_type, short=True)
        for pane_id, pane in self.panes.items():
            if pane_id != "tokens":
                pane.relabel(labels[pane_id], short[pane_id])
        self.chart.set_labels((labels["allocated"], labels["reserved"], labels["peak"]))

    def set_view(self, view: str) -> None:
        """Which of chart / top ops / ledger fills the lower area on narrow terminals."""
        lower = self.query_one("#lower")
        lower.set_class(False, f"view-{self.view}")
        self.view = view
        lower.set_class(True, f"view-{view}")

    def can(self, request: str) -> bool:
        """Whether the run accepts ``request`` (its run_started row lists what it can do)."""
        started = self.run_state.started
        if started is None or not isinstance(started.get("requests"), list):
            return request != "leak_start" or self.source.in_process
        return request in started["requests"]
