"""How each kind of event shows on the dashboard: one handler per kind in LIVE_EVENTS, and for
every other kind that is loud in probes/records/events.py a toast of the kind's own summary.

A new kind needs nothing here unless it shows as more than that toast. A run's past, replayed
when the dashboard opens (tui/app.py _load_history), gets no default toasts: they would say
"just now" of something long gone.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from probes import records as R
from probes.records import Event
from tui.panes import counter_pane

TOAST_S = 5.0  # how long a default toast stays


class LiveEvents:
    """Mixed into MemtopApp (tui/app.py); uses its widgets and the request flags the keys set
    (tui/app_actions.py)."""

    replaying = False  # True while the run's past is taken in

    def show_event(self: Any, event: Event) -> None:
        """One Event from the run, to the widget that shows it."""
        handler = LIVE_EVENTS.get(event.event)
        if handler is not None:
            handler(self, event)
        elif event.kind is not None and event.kind.loud and not self.replaying:
            self.notify(event.summary(), title=event.event.replace("_", " "), timeout=TOAST_S)

    def _run_started(self: Any, event: Event) -> None:
        device = str(event.data.get("device") or "cpu")
        self.relabel("cuda" if device.startswith("cuda") else "cpu")
        self.update_notes()  # the scale and loss panes say why they show none
        if event.data.get("mode") == "infer":
            self.ledger.set_placeholder("inference: no training ledger; the KV cache pane "
                                        "and the admission line above are its ledger")

    def _request_done(self: Any, event: Event) -> None:
        """No toast: a request ends every second or so, and its TTFT and decode times are in
        the phases pane already (a toast each covered the panes in a pile)."""

    def _admission(self: Any, event: Event) -> None:
        if self.admission is not None:
            self.admission.show(event.data)

    def _leak_suspected(self: Any, event: Event) -> None:
        counter = str(event.data.get("counter"))
        self.leak_banner.suspected(event.step, event.data)
        pane = counter_pane(counter, self.device_type)
        if pane is not None:
            self._alert_panes[counter] = pane
            self.panes[pane].set_class(True, "-alert")

    def _leak_forecast(self: Any, event: Event) -> None:
        self.leak_banner.forecast(event.step, event.data)

    def _leak_cleared(self: Any, event: Event) -> None:
        self.leak_banner.cleared(event.step, event.data)
        if not self.leak_banner.alerts:
            self.culprit_box.leak_over()
        pane = self._alert_panes.pop(str(event.data.get("counter")), None)
        if pane is not None and pane not in self._alert_panes.values():
            self.panes[pane].set_class(False, "-alert")

    def _leak_culprit(self: Any, event: Event) -> None:
        """The finder's answer: in its box, and a toast when it arrives live."""
        self.culprit_box.show_culprits(event.step, event.data)
        if not self.replaying:
            self.notify(event.summary(), title="who holds memory", timeout=8)

    def _profile_started(self: Any, event: Event) -> None:
        self._profile_requested = False

    def _profile_cancelled(self: Any, event: Event) -> None:
        self._profile_requested = False
        self.ops_table.set_note("profiler window cancelled; press p to open a new one")
        self.notify(f"profiler window cancelled: {event.data.get('reason', '')}", timeout=3)

    def _profile_done(self: Any, event: Event) -> None:
        self._profile_requested = False
        self._sort_target = "ops"
        # several ranks: the panes' rank (0) says so in the table's title
        self.ops_table.show_window(event.step, event.data,
                                   rank=event.rank if self.ranks_mode else None)
        if self.size.width < 100:  # narrow: the table takes the chart's place
            self.set_view("ops")
        span = R.window_name(R.window_steps(event.data), event.step)
        self.notify(f"top ops ready ({span}); o changes the sort", timeout=4)

    def _ledger(self: Any, event: Event) -> None:
        self.ledger.show_ledger(event.data)
        self.modules_table.set_ledger(event.data)  # its total line reconciles with it

    def _attribution_started(self: Any, event: Event) -> None:
        self._attribution_requested = False
        self.modules_table.set_note(f"memory window open at step {event.step}: "
                                    f"{event.summary()}")

    def _attribution_cancelled(self: Any, event: Event) -> None:
        self._attribution_requested = False
        self.modules_table.set_note("memory window cancelled; press a to open a new one")
        if not self.replaying:
            self.notify(f"memory window cancelled: {event.data.get('reason', '')}", timeout=3)

    def _memory_attribution(self: Any, event: Event) -> None:
        """The window's table, in the side column (narrow: in the chart's place)."""
        self._attribution_requested = False
        self._sort_target = "modules"
        self.modules_table.show_window(event.step, event.data, self.ledger.data)
        if self.size.width < 100:
            self.set_view("modules")
        if not self.replaying:
            self.notify(f"modules ready (step {event.step}): {event.summary()}; o changes "
                        "the sort", timeout=5)

    def _infer_attribution(self: Any, event: Event) -> None:
        """`memtop infer`'s window: its table (KV cache, prefill and decode peaks) in the same
        place as a training window's."""
        from tui.widgets.module_memory import INFER_TABLE

        self._attribution_requested = False
        self._sort_target = "modules"
        self.modules_table.show_window(event.step, event.data, table=INFER_TABLE)
        if self.size.width < 100:
            self.set_view("modules")
        if not self.replaying:
            self.notify(f"modules ready (step {event.step}): {event.summary()}; o changes "
                        "the sort", timeout=5)

    def _leak_demo_started(self: Any, event: Event) -> None:
        self._leak_toggling = False

    def _leak_demo_stopped(self: Any, event: Event) -> None:
        self._leak_toggling = False
        released = event.data.get("released_tensors", "?")
        self.notify(f"leak demo stopped: released {released} tensors", timeout=4)

    def _paused_or_resumed(self: Any, event: Event) -> None:
        self._pause_pending = None

    def _error(self: Any, event: Event) -> None:
        d = event.data
        self.error_banner.show_message(
            f"{self._what} FAILED at step {event.step}: {d.get('error_type', 'Error')}: "
            f"{d.get('message', '')}\nthe last samples stay on screen; the traceback is in "
            f"{self.run_dir / 'metrics.jsonl'}; q quits")

    def _memory_snapshot(self: Any, event: Event) -> None:
        self.notify(f"memory snapshot: {event.summary()}", timeout=6,
                    severity="error" if event.data.get("error") else "information")

    def _hint(self: Any, event: Event) -> None:
        """Each kind once a run (probes/instruments/hints.py): a long toast."""
        self.notify(f"{event.data.get('title')}: {event.data.get('why')}", title="hint",
                    timeout=10)

    def _memory_guard(self: Any, event: Event) -> None:
        # the event's own words (would pass / passed / is over, with the room left) and its
        # forecast, the newest: the leak banner kept the alert's from seconds before (user pass)
        self.error_banner.show_message(
            f"memory guard stopped the run at step {event.step}: {event.summary()}",
            warning=True)
        self.leak_banner.guard_stopped(event.step, event.data)

    def _control(self: Any, event: Event) -> None:
        """A request another process sent (a viewer, the launcher); this dashboard's own keys
        show where they act already."""
        source = event.data.get("source")
        if not self.replaying and source not in ("keyboard", f"viewer pid {os.getpid()}"):
            self.notify(event.summary(), title="control", timeout=TOAST_S)


LIVE_EVENTS: dict[str, Callable[[Any, Event], None]] = {
    R.RUN_STARTED: LiveEvents._run_started,
    R.ADMISSION: LiveEvents._admission,
    R.REQUEST_DONE: LiveEvents._request_done,
    R.LEAK_SUSPECTED: LiveEvents._leak_suspected,
    R.LEAK_CLEARED: LiveEvents._leak_cleared,
    R.LEAK_CULPRIT: LiveEvents._leak_culprit,
    R.LEAK_FORECAST: LiveEvents._leak_forecast,
    R.PROFILE_STARTED: LiveEvents._profile_started,
    R.PROFILE_CANCELLED: LiveEvents._profile_cancelled,
    R.PROFILE_DONE: LiveEvents._profile_done,
    R.LEDGER: LiveEvents._ledger,
    R.ATTRIBUTION_STARTED: LiveEvents._attribution_started,
    R.ATTRIBUTION_CANCELLED: LiveEvents._attribution_cancelled,
    R.MEMORY_ATTRIBUTION: LiveEvents._memory_attribution,
    R.INFER_ATTRIBUTION: LiveEvents._infer_attribution,
    R.LEAK_DEMO_STARTED: LiveEvents._leak_demo_started,
    R.LEAK_DEMO_STOPPED: LiveEvents._leak_demo_stopped,
    R.PAUSED: LiveEvents._paused_or_resumed,
    R.RESUMED: LiveEvents._paused_or_resumed,
    R.ERROR: LiveEvents._error,
    R.MEMORY_SNAPSHOT: LiveEvents._memory_snapshot,
    R.HINT: LiveEvents._hint,
    R.MEMORY_GUARD: LiveEvents._memory_guard,
    R.CONTROL: LiveEvents._control,
}
