"""Which module holds the memory: the last memory attribution window's table (the `a` key),
sorted by activations, `o` for another column. Its text is tui/format_attribution.py's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import Static

from probes.records.attribution import SORT_KEYS, next_sort_key
from tui import format_infer_attribution as infer_text
from tui.format import fit
from tui.format_attribution import table_lines, table_title


@dataclass(frozen=True)
class TableText:
    """The text of one kind of window's table: a training window's (``memory_attribution``)
    or `memtop infer`'s (``infer_attribution``)."""

    lines: Callable[[dict[str, Any], str, int, dict[str, Any] | None], list[str]]
    title: Callable[[int, dict[str, Any], str], str]
    sort_keys: tuple[str, ...]
    next_sort: Callable[[str], str]


TRAIN_TABLE = TableText(table_lines, table_title, SORT_KEYS, next_sort_key)
INFER_TABLE = TableText(lambda data, key, width, _ledger: infer_text.table_lines(data, key, width),
                        infer_text.table_title, infer_text.SORT_KEYS, infer_text.next_sort_key)

PLACEHOLDER = ("no memory window yet: press a for each module's parameters, gradients, "
               "optimizer state, saved activations and forward peak")


class ModuleMemoryTable(Vertical):
    """Hidden until a window's table (or a note) is shown; sorting is local (no torch)."""

    DEFAULT_CSS = """
    ModuleMemoryTable {
        height: 5fr;  /* asked for with a key: most of the side column beside the chart */
        min-height: 4;
        width: 1fr;
        border: round $primary-background-lighten-2;
        border-title-color: $text;
        overflow-y: auto;  /* more rows than the column's height: a scrollbar says so */
        scrollbar-size-vertical: 1;
        display: none;
    }
    ModuleMemoryTable.-shown { display: block; }
    ModuleMemoryTable > Static { height: auto; width: 1fr; padding: 0 1; }
    ModuleMemoryTable.-empty > Static { color: $text-muted; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="-empty")
        self.data: dict[str, Any] | None = None
        self.step: int | None = None
        self.sort_key = SORT_KEYS[0]
        self.table = TRAIN_TABLE
        self.ledger: dict[str, Any] | None = None
        self._body = Static(PLACEHOLDER, markup=False)
        self._text = ""

    def compose(self) -> ComposeResult:
        yield self._body

    def on_mount(self) -> None:
        self.border_title = "modules"

    @property
    def text(self) -> str:
        """What the table shows now (tests)."""
        return self._text

    @property
    def loaded(self) -> bool:
        return self.data is not None

    def show_window(self, step: int, data: dict[str, Any],
                    ledger: dict[str, Any] | None = None, table: TableText = TRAIN_TABLE) \
            -> None:
        """A finished window (``memory_attribution``, or ``infer_attribution`` with
        INFER_TABLE): its rows, sorted by the table's first key."""
        self.step, self.data, self.ledger, self.table = step, data, ledger, table
        self.sort_key = table.sort_keys[0]
        self.set_class(False, "-empty")
        self._show()
        self._render_table()

    def _show(self) -> None:
        """On screen from now on; its column (tui/memtop.tcss) makes room for it."""
        self.set_class(True, "-shown")
        if self.parent is not None:
            self.parent.set_class(True, "-with-modules")

    def set_ledger(self, ledger: dict[str, Any]) -> None:
        """A newer ledger: the reconciling line follows it."""
        self.ledger = ledger
        if self.data is not None:
            self._render_table()

    def set_note(self, text: str) -> None:
        """A window requested, running or cancelled, while no table is loaded."""
        if self.data is None:
            self._show()
            self._text = text
            self._body.update(text)

    def cycle_sort(self) -> str | None:
        """The next sort column; None when there is nothing to sort."""
        if self.data is None:
            return None
        self.sort_key = self.table.next_sort(self.sort_key)
        self._render_table()
        return self.sort_key

    def on_resize(self) -> None:
        if self.data is not None:
            self._render_table()

    def _render_table(self) -> None:
        data = self.data
        if data is None:
            return
        # less the text's padding (2) and the scrollbar a long table brings (1): a line one
        # column too wide wrapped every row's last cell onto a line of its own at 80 columns
        width = max(20, (self.content_region.width or self.size.width or 78) - 3)
        text = "\n".join(self.table.lines(data, self.sort_key, width, self.ledger))
        if text != self._text:
            self._text = text
            self._body.update(text)
        title = self.table.title(self.step or 0, data, self.sort_key)
        self.border_title = Content(fit(title, max(10, width)))
        self.border_subtitle = Content(fit("a: a new window", max(10, width - 2)))
