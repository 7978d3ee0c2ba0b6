"""The `?` screen: the keys, what each pane's counter means (from the pane table, tui/panes.py),
and the tutorial's warnings about reading them.

Opening it must not stall the UI thread (benchmarks/RESULTS.md: layout and compositing of the old
screen cost 25-35 ms a frame, up to 450 ms under load): the screen is opaque, so the dashboard below
is neither composited under it nor repainted through it at every 2 Hz tick; its text is one
pre-built Static, not a widget per paragraph; and the app builds it once and re-pushes the same
instance (tui/app_actions.py), so an open is a repaint, not a compose and a layout. """

from __future__ import annotations

import textwrap

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Static

from probes.records import HINTS
from tui.charts import spark_rule
from tui.key_roles import TRAIN, keys_for
from tui.panes import PANES
from tui.widgets.metric_pane import HISTORY

KEYS = (
    ("p", "profiler window (wait, warmup, active steps), then the top-ops table; "
          "p during a window cancels it. Its traced steps, the steps while the table is "
          "computed and the 3 after are left out of the leak detector, timing and peaks"),
    ("a", "memory window: which module holds the memory. For 1 warm-up and 1 measured step "
          "(--attribute-steps) each module's parameters, gradients, optimizer state, "
          "activations saved for backward and forward peak, as a table sorted by "
          "activations (blocks, then their children summed over the blocks), its total "
          "checked against the ledger, and hints with the measured figures (what grows with "
          "T², what checkpointing would free and cost, the optimizer state's size). a during "
          "a window cancels it; its steps and the one after are left out of the leak "
          "detector, timing and peaks. In memtop infer: the next request free of the warm-up "
          "and the profiler (--attribute-request), its prefill and first decode step: each "
          "module's KV cache and forward peak in each phase"),
    ("l", "leak demo on/off; off drops what was leaked (the fix)"),
    ("space", "pause / resume at the next step boundary (the header's clock holds while "
              "paused: it counts the run's time without its pauses)"),
    ("r", "write report.md + report.json now"),
    ("s", "save an SVG screenshot into the run folder"),
    ("m", "CUDA: memory snapshot into the run folder for pytorch.org/memory_viz (state only "
          "unless --memory-history)"),
    ("w", "who holds memory: what grew over the next steps and what keeps it (also "
          "automatic at a leak alert); the look's steps and the one after are left out of "
          "the leak detector, timing and peaks"),
    ("o", "change the sort column of the table in view (top ops or modules; the newer one "
          "beside the chart)"),
    ("v", "the lower area: chart, top ops, modules, ledger, step split under 100 columns; "
          "from 100 the chart with top ops, modules and ledger beside it, then the step "
          "split"),
    ("?", "this help (esc closes)"),
    ("q", "stop at the next step boundary, write the report, quit"),
)


def keys_markup(role: str = TRAIN, width: int | None = None) -> str:
    """The keys as aligned lines (a rich Table would be re-rendered by every layout pass);
    ``role`` (tui/key_roles.py): a viewer's q leaves, an ended run offers no p, l, space, w, m.
    ``width``: the text's columns, so a long line goes on under its text, not under its key."""
    keys = keys_for(KEYS, role)
    col = max(len(key) for key, _ in keys) + 2
    lines = []
    for key, text in keys:
        wrapped = textwrap.wrap(text, width - col) if width and width > col + 20 else [text]
        lines.append(f"[b]{key}[/b]{' ' * (col - len(key))}{wrapped[0]}")
        lines += [" " * col + more for more in wrapped[1:]]
    return "\n".join(lines)


def help_markup(device_type: str, counters: str | None, role: str = TRAIN,
                width: int | None = None) -> str:
    """The whole help text as one markup string, paragraphs separated by blank lines
    (``width``: keys_markup's)."""
    paragraphs = ["[b]Keys[/b]\n" + keys_markup(role, width)]
    if counters:
        paragraphs.append("counters read from: " + escape(counters))
    paragraphs += counter_paragraphs(device_type)
    paragraphs.append(spark_rule(HISTORY))
    paragraphs += WARNINGS
    paragraphs.append(hints_text(device_type))
    return "\n\n".join(paragraphs)


def counter_paragraphs(device_type: str) -> list[str]:
    """What each pane's counter is on this device and when it is read (tui/panes.py), each
    named by its label and, where it differs, the short label a narrow terminal shows."""
    paragraphs = [CPU_INTRO] if device_type != "cuda" else []
    for spec in PANES:
        on = spec.on(device_type)
        short = f" ({escape(on.short)})" if on.short != on.label else ""
        paragraphs.append(f"[b]{escape(on.label)}[/b]{short}: {on.help}")
        if on.note_help:
            paragraphs.append(on.note_help)
    return paragraphs


# One entry per paragraph: Textual wraps them to the terminal's width.
CPU_INTRO = ("On CPU there is no caching allocator: memtop reads glibc's heap counters "
             "(mallinfo2, all threads' arenas) in place of allocated/reserved.")

WARNINGS = (
    "[b]Why nvidia-smi differs[/b]: it shows the driver's view (the reserved cache, the CUDA "
    "context, library workspaces), not live tensors. Deleting a tensor lowers allocated; "
    "nvidia-smi does not move.",
    "[b]empty_cache() is not a fix[/b]: it only hands unused cached blocks back to the driver. "
    "Memory held by live tensors (a kept loss with its graph, a list of outputs) stays, and "
    "calling it often makes later allocations slower. Fix the reference that keeps the tensors "
    "alive instead.",
    "[b]leak alert[/b]: the detector watches end-of-step memory after warmup, leaving out the "
    "steps a profiler window or a culprit look (w) disturbed; a sustained rise "
    "raises the banner and marks the pane that grew. Usual causes: losses.append(loss) (log "
    "loss.item() instead), outputs kept on the device (move them off with .cpu() or drop them).",
)


def hints_text(device_type: str) -> str:
    """The live hints (probes/records/hints.py HINTS), those that cannot appear here marked so."""
    lines = ["[b]Live hints[/b] (each shown once a run, and logged as a hint event):"]
    for h in HINTS:
        where = "" if h.devices in ("any", device_type) else f" ({h.devices.upper()} only)"
        lines.append(f"• [b]{h.title}[/b]{where}: {h.why}")
    return "\n".join(lines)


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; background: $background; }
    HelpScreen > VerticalScroll {
        width: 100%;
        max-width: 104;
        height: 100%;
        max-height: 44;
        border: round $primary;
        background: $surface;
        padding: 0 1;
    }
    HelpScreen Static { width: 1fr; }
    """

    BINDINGS = [
        Binding("escape", "close", "close"),
        Binding("question_mark", "close", "close", show=False),
        Binding("q", "close", "close", show=False),
    ]

    def __init__(self, device_type: str, counters: str | None = None,
                 role: str = TRAIN) -> None:
        super().__init__()
        self.device_type = device_type
        self.counters = counters
        self.role = role
        self._text_width: int | None = None  # the width the keys were last wrapped to

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body") as body:
            body.border_title = "memtop help (esc or ? closes, arrows scroll)"
            yield Static(help_markup(self.device_type, self.counters, self.role),
                         id="help-text")

    def on_screen_resume(self) -> None:
        self.query_one("#help-body").focus()

    def on_resize(self, event: events.Resize) -> None:
        """The keys' lines wrapped under their text at the width the text now has (only when
        it changed: an open stays a repaint)."""
        text = self.query_one("#help-text", Static)
        width = (text.content_region.width or text.size.width) - 2  # room for the scrollbar
        if width > 0 and width != self._text_width:
            self._text_width = width
            text.update(help_markup(self.device_type, self.counters, self.role, width))

    def action_close(self) -> None:
        self.dismiss(None)
