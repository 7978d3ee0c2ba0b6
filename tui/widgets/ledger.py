"""The memory ledger: each measured line beside the tutorial's prediction for it."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from probes.analysis.fit_live import LivePeaks
from tui.format import fit
from tui.format_panels import ledger_footer, ledger_rows

PLACEHOLDER = "ledger: waiting for a sampled step (params, grads, AdamW state, activations…)"


def ledger_table_text(data: dict[str, Any], width: int, live: str | None = None) -> str:
    """Fixed-width rows: name, measured, predicted, formula (dropped when narrow); under the
    footer the live "fits B ≤ …" line once the run is steady (probes/analysis/fit_live.py)."""
    rows = ledger_rows(data)
    name_w = max([len(r[0]) for r in rows] + [4])
    name_w = min(name_w, 22)
    head = f"{'line':<{name_w}} {'measured':>10} {'predicted':>10}"
    show_note = width >= len(head) + 12
    if show_note:
        head += "  formula"
    lines = [fit(head, width)]
    for name, measured, predicted, note in rows:
        text = f"{fit(name, name_w):<{name_w}} {measured:>10} {predicted:>10}"
        if show_note and note:
            text += "  " + note
        lines.append(fit(text, width))
    lines.append(fit(ledger_footer(data), width))
    if live:
        lines.append(fit(live, width))
    return "\n".join(lines)


class LedgerPane(Vertical):
    DEFAULT_CSS = """
    LedgerPane {
        height: 3fr;  /* shares a short column with top ops; its lines + border at most */
        max-height: 14;
        width: 1fr;
        border: round $primary-background-lighten-2;
        overflow-y: auto;  /* a short column: a scrollbar says there is more (mouse wheel) */
        scrollbar-size-vertical: 1;
    }
    LedgerPane > Static { height: auto; width: 1fr; padding: 0 1; }
    LedgerPane.-empty { height: auto; }
    LedgerPane.-empty > Static { color: $text-muted; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="-empty")
        self.data: dict[str, Any] | None = None
        self._body = Static(PLACEHOLDER, markup=False)
        self._text = ""
        self.peaks = LivePeaks()  # the budget counter after the ledger's step: the live line
        self.live: str | None = None

    def compose(self) -> ComposeResult:
        yield self._body

    def on_mount(self) -> None:
        self.border_title = "memory ledger (measured vs predicted)"

    def set_placeholder(self, text: str) -> None:
        """What the pane says while it has no ledger (e.g. an inference run never has one)."""
        if self.data is None:
            self._body.update(text)

    def show_ledger(self, data: dict[str, Any]) -> None:
        self.data = data
        self.peaks.new_ledger(data)
        self.live = None
        self.set_class(False, "-empty")
        self._draw()

    def push(self, samples: list[Any]) -> None:
        """Step rows as they arrive: the live line is recomputed from them (here, off the
        training thread) and redrawn when it changed."""
        if self.peaks.add(samples):
            live = self.peaks.line()
            if live != self.live:
                self.live = live
                self._draw()

    def on_resize(self) -> None:
        if self.data is not None:
            self._draw()

    @property
    def text(self) -> str:
        return self._text

    def _draw(self) -> None:
        if self.data is None:
            return
        # less the text's padding (2) and the scrollbar a short column brings (1): a line one
        # column too wide wrapped ("2 × P ×" over "4…" beside the module table)
        width = max(20, (self.content_region.width or self.size.width or 60) - 3)
        text = ledger_table_text(self.data, width, self.live)
        if text != self._text:
            self._text = text
            self._body.update(text)
            # no taller than its lines and border: the rest of a tall column goes to top ops
            self.styles.max_height = text.count("\n") + 3
