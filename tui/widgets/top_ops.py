"""The last profiler window's hot ops as a DataTable, with a key to change the sort column."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import DataTable, Static

from probes.records.phase_ops import split_ranges
from probes.records.windows import window_name, window_opened, window_steps
from tui.format import fit
from tui.format_panels import (
    default_sort_key,
    next_sort_key,
    op_cell,
    op_column_title,
    op_columns,
    op_name_width,
    ops_title,
    shorten_op,
    sort_ops,
    visible_op_columns,
)

PLACEHOLDER = "no profiler window yet: press p to trace a few steps (wait/warmup/active)"


class TopOpsTable(Vertical):
    """Keeps the last window's rows until the next window; sorting is local (no torch)."""

    DEFAULT_CSS = """
    TopOpsTable {
        height: 1fr;
        min-height: 4;  /* its placeholder's two lines beside a leak banner and culprit box */
        width: 1fr;
        border: round $primary-background-lighten-2;
        border-title-color: $text;
    }
    TopOpsTable > #ops-placeholder { color: $text-muted; height: auto; padding: 0 1; }
    TopOpsTable > DataTable { height: 1fr; display: none; }
    TopOpsTable.-loaded > DataTable { display: block; }
    TopOpsTable.-loaded > #ops-placeholder { display: none; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.ops: list[dict[str, Any]] = []
        self.ranges: list[dict[str, Any]] = []
        self.columns: list[str] = []
        self.sort_key = "cpu_total_us"
        self.window: dict[str, Any] = {}
        self._table: DataTable = DataTable(zebra_stripes=True, cursor_type="none")
        # held, not queried: a note set while the app shuts down finds it removed, not missing
        self._placeholder = Static(PLACEHOLDER, id="ops-placeholder", markup=False)

    def compose(self) -> ComposeResult:
        yield self._placeholder
        yield self._table

    def on_mount(self) -> None:
        self.border_title = "top ops"

    def show_window(self, step: int, data: dict[str, Any], rank: int | None = None) -> None:
        """A finished window (``profile_done`` event): replace the rows, default sort;
        ``rank``, under several ranks, is whose window it is (the title says it)."""
        # an inference window's rows are ops: its phase label and ProfilerStep* are said apart
        self.ops, self.ranges = split_ranges(data.get("top_ops", []) or [], data.get("phase"))
        self.columns = op_columns(self.ops)
        self.sort_key = default_sort_key(data.get("sort_by"), self.columns)
        self.window = dict(data, step=step, rank=rank)
        self.set_class(True, "-loaded")
        self._populate()

    def set_note(self, text: str) -> None:
        """Status text while no table is loaded (e.g. a cancelled window)."""
        if not self.ops:
            self._placeholder.update(text)

    def cycle_sort(self) -> str | None:
        """Next sort column; returns its title, None when there is nothing to sort."""
        if not self.ops:
            return None
        self.sort_key = next_sort_key(self.sort_key, self.columns)
        self._populate()
        return op_column_title(self.sort_key)

    def on_resize(self) -> None:
        if self.ops:
            self._populate()

    @property
    def row_names(self) -> list[str]:
        """Full op names in display order (tests)."""
        return [op.get("name", "?") for op in sort_ops(self.ops, self.sort_key)]

    def _populate(self) -> None:
        width = self.content_region.width or self.size.width or 60
        shown = visible_op_columns(self.columns, self.sort_key, width)
        name_w = op_name_width(width, len(shown))
        table = self._table
        table.clear(columns=True)
        # every label and cell as Text: DataTable reads a str as markup ("[memory]" vanished)
        table.add_column(Text("op"), key="name", width=name_w)
        for key in shown:
            title = op_column_title(key) + (" ▼" if key == self.sort_key else "")
            table.add_column(Text(title), key=key)
        for op in sort_ops(self.ops, self.sort_key):
            cells = [Text(shorten_op(str(op.get("name", "?")), name_w))]
            cells += [Text(op_cell(key, op.get(key))) for key in shown]
            table.add_row(*cells)
        step = self.window.get("step")
        where = self.window.get("dir")
        phase = self.window.get("phase")  # inference windows cover one phase only
        what = f"{phase} top ops" if phase else "top ops"
        rank = self.window.get("rank")
        if rank is not None:
            what += f" · rank {rank}"
        hidden = len(self.columns) - len(shown)
        # named by the steps its table sums; the folder by the step the window opened at
        window = window_name(window_steps(self.window), step)
        title = ops_title(what, window, op_column_title(self.sort_key), hidden, max(10, width - 2))
        analysis = self.window.get("analysis_s")
        rest = ""
        if self.ranges:  # the window's own labels, left out (probes/records/phase_ops.py)
            rest += " · not ops: " + ", ".join(str(r.get("name", "?")) for r in self.ranges)
        if analysis is not None:
            rest += f" · analysed in {analysis:.1f} s"
        # the folder's step is where the window opened, before its warm-up: said where it fits
        opened, span = window_opened(self.window), window_steps(self.window)
        room = max(10, width - 4)
        subtitle = str(where or "") + rest
        if opened is not None and span and opened != span[0]:
            longer = f"{where} (opened at step {opened}){rest}"
            subtitle = longer if len(longer.strip(" ·")) <= room else subtitle
        # plain Content: a str title is markup, and the folder and labels are the run's own
        self.border_title = Content(title)
        self.border_subtitle = Content(fit(subtitle.strip(" ·"), room))
