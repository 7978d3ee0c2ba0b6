"""The dashboard: panes, memory chart, top-ops table, leak banner and ledger over one run.

It reads a run source (tui/sources.py): memtop's trainer on a thread of this process
(tui/trainer_source.py), or a run folder another process writes (or wrote). A 2 Hz timer polls
the source and updates only what changed (tui/app_refresh.py). The UI never calls torch. The
panes are made from the pane table (tui/panes.py); how each event shows is tui/live_events.py;
the header, status and baseline lines are tui/status_bars.py; keys and quitting are
tui/app_actions.py; the notices it showed are kept by tui/notices.py; several ranks are
tui/app_ranks.py; running on a real terminal (fd 2, signals, the bounded shutdown) is
tui/dashboard_run.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical

from probes import records as R
from probes.records import Event, Record, StepSample
from probes.runfolder.state import RunState
from probes.tools.ring import Ring
from tui.app_actions import AppActions
from tui.app_ranks import RanksView
from tui.app_refresh import RefreshLoop
from tui.live_events import LiveEvents
from tui.notices import NoticeLog
from tui.panes import PANES, chart_labels, grid_size, pane_labels
from tui.run_end import RunEnd
from tui.sources import FolderSource, RunSource
from tui.status_bars import StatusBars
from tui.trainer_source import DeferredTrainer, EventWake, TrainerSource
from tui.widgets.admission_line import AdmissionLine
from tui.widgets.baseline_bar import BaselineBar
from tui.widgets.culprit_box import CulpritBox
from tui.widgets.error_banner import ErrorBanner
from tui.widgets.footer import MemtopFooter
from tui.widgets.header import MemtopHeader
from tui.widgets.kv_cache import KvCachePane
from tui.widgets.leak_banner import LeakBanner
from tui.widgets.ledger import LedgerPane
from tui.widgets.memory_chart import MemoryChart
from tui.widgets.metric_pane import MetricPane
from tui.widgets.module_memory import ModuleMemoryTable
from tui.widgets.phase_throughput import PhaseThroughputPane
from tui.widgets.rank_table import RankTable
from tui.widgets.status_line import StatusLine
from tui.widgets.step_split import StepSplitPane
from tui.widgets.too_small import TooSmallNotice
from tui.widgets.top_ops import TopOpsTable

if TYPE_CHECKING:
    from probes.analysis.baseline import BaselineWatch

REFRESH_S = 0.5  # 2 Hz: the rate docs/ARCHITECTURE.md records at 0.98 of headless throughput
# (tui/app_refresh.py)
CHART_EVERY_S = 5.0  # plotext rebuilds cost ~30 ms: rarely
VIEWS = ("chart", "ops", "modules", "ledger", "split")
FIRST_SAMPLE_POLL_S = 0.05  # until the first sample: startup target is the bare floor + 0.2 s


class MemtopApp(RefreshLoop, LiveEvents, StatusBars, RanksView, AppActions, NoticeLog,
                App[int]):
    """One run's dashboard. Build with :meth:`for_run` (train) or :meth:`for_folder` (view)."""

    CSS_PATH = "memtop.tcss"
    TITLE = "memtop"
    ENABLE_COMMAND_PALETTE = False
    AUTO_FOCUS = None  # keys go to the app; Tab reaches the top-ops table when wanted
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-tall")]
    BINDINGS = [
        Binding("p", "profile", "profile"),
        Binding("a", "attribute", "modules"),
        Binding("l", "leak", "leak"),
        Binding("space", "pause", "pause"),
        Binding("space", "resume", "resume"),  # one of the two is shown (tui/key_roles.py)
        Binding("r", "report", "report"),
        Binding("s", "screenshot", "svg"),
        Binding("o", "sort", "sort"),
        Binding("v", "view", "view"),
        Binding("x", "stop_run", "stop run"),  # a viewer's only (tui/key_roles.py)
        Binding("m", "snapshot", "snapshot", show=False),
        Binding("w", "who_holds", "who holds"),
        Binding("question_mark", "help", "help"),
        Binding("q", "request_quit", "quit"),
        Binding("ctrl+q", "request_quit", "quit", show=False, priority=True),
        # Ctrl-C reaches a raw-mode terminal as a key, not SIGINT: the same quit and exit 130
        Binding("ctrl+c", "interrupt", "quit", show=False, priority=True),
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
        self._init_notices()

    @classmethod
    def for_run(cls, config: Any, run_dir: Path, autostart: bool = True, deferred: bool = False,
                **kwargs: Any) -> MemtopApp:
        """`memtop train`: the trainer with its instruments on a thread, records via a ring.

        ``deferred``: build the trainer (and import torch) on its thread once started, so the
        frame is on screen first (tui/trainer_source.py DeferredTrainer); the device is then learnt
        from the run_started row."""
        ring: Ring[Record] = Ring(maxlen=4096)
        wake = EventWake()
        trainer: Any
        if deferred:
            trainer = DeferredTrainer(config, run_dir, sinks=[ring.push, wake])
            device = str(config.device).strip().lower()
            kwargs.setdefault("device_type", "cuda" if device.startswith("cuda") else "cpu")
        else:
            from probes.monitor import default_hooks
            from trainer.loop import Trainer

            # an app that does not freeze the gc keeps its trainer from freezing it either:
            # a frozen run's cycles (its model, optimizer state) outlive it (issue 45, 6.4 MiB
            # left on the H200 by the dashboard claim)
            trainer = Trainer(config, run_dir, sinks=[ring.push, wake],
                              hooks=default_hooks(**config.hook_options()),
                              freeze_gc=kwargs.get("freeze_gc", True))
            kwargs.setdefault("device_type", config.torch_device.type)
        source = TrainerSource(trainer, ring)
        source.wake = wake
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

    @property
    def gc_frozen(self) -> bool:
        """Whether the UI has frozen the gc (``freeze_gc``, once the run started; undone by
        shutdown)."""
        return self._gc_frozen

    # layout ------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        labels = pane_labels(self.device_type)
        short = pane_labels(self.device_type, short=True)
        yield TooSmallNotice(id="too-small")
        yield MemtopHeader(id="header")
        yield ErrorBanner(id="error")
        yield LeakBanner(id="leak")
        yield CulpritBox(id="culprit")
        grid = Grid(id="panes")  # one cell per pane of the table (tui/panes.py)
        grid.styles.grid_size_columns, grid.styles.grid_size_rows = grid_size()
        with grid:
            for spec in PANES:
                yield MetricPane(spec.id, labels[spec.id], spec.kind, short[spec.id])
        if self.is_infer:  # the inference ledger (docs/INFERENCE.md): cache, phases, admission
            with Vertical(id="infer"):
                with Horizontal(id="infer-panes"):
                    yield KvCachePane(self.config.get("block_size"), id="kv")
                    yield PhaseThroughputPane(id="phases")
                yield AdmissionLine(id="admission")
        with Horizontal(id="lower", classes=f"view-{self.view}"):
            yield RankTable(id="ranks")
            yield StepSplitPane(self.device_type, id="split")
            with Vertical(id="chart-box"):
                yield MemoryChart(chart_labels(self.device_type), every_s=self.chart_every_s,
                                  id="chart")
            with Vertical(id="side"):
                yield TopOpsTable(id="ops")
                yield ModuleMemoryTable(id="modules")
                yield LedgerPane(id="ledger")
        yield BaselineBar(id="baseline")
        yield StatusLine(id="status")
        yield MemtopFooter(compact=True)

    def on_mount(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.panes = {p.pane_id: p for p in self.query(MetricPane)}
        self.header_bar = self.query_one(MemtopHeader)
        self.status_line = self.query_one(StatusLine)
        self.leak_banner = self.query_one(LeakBanner)
        self.culprit_box = self.query_one(CulpritBox)
        self.error_banner = self.query_one(ErrorBanner)
        self.too_small = self.query_one(TooSmallNotice)
        self.too_small.show_size(self.size.width, self.size.height)
        self.chart = self.query_one(MemoryChart)
        self.chart_box = self.query_one("#chart-box")  # kept: queried late, it may be gone
        self.chart_box.border_title = self.chart.title()
        self.ops_table = self.query_one(TopOpsTable)
        self.modules_table = self.query_one(ModuleMemoryTable)
        self.ledger = self.query_one(LedgerPane)
        self.rank_table = self.query_one(RankTable)
        self.step_split = self.query_one(StepSplitPane)
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
        wake = getattr(self.source, "wake", None)
        if wake is not None:  # the table a user waits for: on screen at once, not next tick
            wake.callback = lambda: self._on_loop(self.refresh_from_source)
        self.refresh_from_source()
        if self.ring is not None:  # the first sample on screen at once, not at the next tick
            self._first_sample_timer = self.set_interval(FIRST_SAMPLE_POLL_S,
                                                         self._poll_first_sample)
        self._mounted_actions()

    def on_resize(self, event: events.Resize) -> None:
        """Below 80×24 the layout cannot hold every pane: say so (the run goes on)."""
        if hasattr(self, "too_small"):
            self.too_small.show_size(event.size.width, event.size.height)

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

    def set_view(self, view: str) -> None:
        """Which of chart / top ops / modules / ledger fills the lower area on narrow
        terminals."""
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
