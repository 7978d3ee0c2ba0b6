"""The dashboard's keys and its ways out, apart from the layout and the refresh (tui/app.py).

Every key that steers the run becomes a request to the run source: straight to the trainer's
control object in `memtop train`, through the run's socket in `memtop view` (off the event
loop, since a socket round trip may take a moment). Quitting `memtop train` stops the trainer
at a step boundary, joins it off the event loop and writes the report; quitting `memtop view`
leaves the run alone.
"""

from __future__ import annotations

import contextlib
import gc
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from textual import work

from tui.key_roles import ENDED, action_shown, key_role
from tui.widgets.confirm import ConfirmScreen
from tui.widgets.help_screen import HelpScreen

# views that show beside the chart from 100 columns (tui/memtop.tcss): `v` skips them there
SIDE_BY_SIDE = ("ops", "modules", "ledger")


class AppActions:
    """Mixed into MemtopApp; uses its source, run state and widgets."""

    def _init_actions(self: Any) -> None:
        self._quitting = False
        self._quit_forced = False
        self._profile_requested = False
        self._attribution_requested = False
        self._sort_target = "ops"  # the table `o` sorts: the one whose content came last
        self._leak_toggling = False
        self._pause_pending: str | None = None  # "pause" / "resume" until the run says so
        self.quit_signal: int | None = None  # SIGTERM/SIGHUP that asked for the quit
        self._early_signal: int | None = None  # one that came before the loop was running
        self._screenshots = 0
        self._report_path: Path | None = None
        self._help_screen: HelpScreen | None = None

    def _mounted_actions(self: Any) -> None:
        if self._early_signal is not None:
            self.call_later(self._quit_for_signal, self._early_signal)

    # steering the run ---------------------------------------------------------------------------
    def _run_over(self: Any) -> bool:
        if self.run_state.finished or self.run_state.state == "failed":
            self.notify("the run has ended: q quits", timeout=3)
            return True
        if not self.source.live and not self.source.in_process and self.ending is None:
            self.notify(f"this run is not live: {self.source.note or 'nothing to steer'}",
                        timeout=4)
            return True
        return False

    def send(self: Any, kind: str, reason: str | None = None) -> None:
        """A request to the run: at once in process, else from a worker thread."""
        if self.source.in_process:
            self.source.request(kind, reason=reason)
        else:
            self._send_worker(kind, reason)

    @work(thread=True, group="request", exit_on_error=False)
    def _send_worker(self: Any, kind: str, reason: str | None) -> None:
        error = self.source.request(kind, reason=reason)  # several ranks: one agreed step
        if error:
            self.call_from_thread(self._request_refused, kind, error)

    @work(thread=True, group="ping", exclusive=True, exit_on_error=False)
    def _ping_worker(self: Any) -> None:
        """A quiet followed run: ping it (up to ~1 s; a dead one refuses at once). The header
        and status line say "not live" from the next refresh."""
        self.source.ping()

    def _request_refused(self: Any, kind: str, error: str) -> None:
        self._profile_requested = self._leak_toggling = False
        self._attribution_requested = False
        self._pause_pending = None
        self.notify(f"{kind}: {error}", severity="warning", timeout=5)
        self.update_status()

    def action_profile(self: Any) -> None:
        if self._run_over():
            return
        if not self.can("profile"):
            self.notify("this run has no profiler window", severity="warning", timeout=3)
            return
        if self.run_state.profile_phase is not None or self._profile_requested:
            self.send("profile_cancel")
            self._profile_requested = False
        else:
            self.send("profile")
            self._profile_requested = True
        self.update_status()

    def action_attribute(self: Any) -> None:
        """`a`: a memory attribution window (which module holds the memory), acted on by the
        training thread at the next step boundary; `a` again cancels it."""
        if self._run_over():
            return
        if not self.can("attribute"):
            self.notify("this run has no memory attribution window", severity="warning",
                        timeout=3)
            return
        if self.run_state.attribution is not None or self._attribution_requested:
            self.send("attribute_cancel")
            self._attribution_requested = False
        else:
            self.send("attribute")
            self._attribution_requested = True
            self.modules_table.set_note("memory window requested: 1 warm-up step, then the "
                                        "measured step(s)…")
            if self.size.width < 100 and not self.modules_table.loaded:
                self.set_view("modules")
        self.update_status()

    def action_leak(self: Any) -> None:
        if self._run_over():
            return
        if not self.can("leak_start"):
            self.notify("this run has no leak demo (memtop train has one)", timeout=3)
            return
        self.send("leak_stop" if self.run_state.leak_active else "leak_start")
        self._leak_toggling = True
        self.update_status()

    def action_pause(self: Any) -> None:
        if self._run_over():
            return
        self._pause_pending = "resume" if self.want_paused else "pause"
        self.send(self._pause_pending)
        self.update_header()
        self._check_role()  # the footer's space now says the other word

    def action_resume(self: Any) -> None:
        """space while paused: the footer says "resume" (tui/key_roles.py); the same toggle."""
        self.action_pause()

    def action_snapshot(self: Any) -> None:
        """`m`: a CUDA memory snapshot into the run folder, written by the training thread at
        the next step boundary (the UI only sends the request)."""
        if self._run_over():
            return
        if not self.can("memory_snapshot"):
            self.notify("memory snapshots need a CUDA run (torch.cuda.memory._snapshot)",
                        timeout=4)
            return
        self.send("memory_snapshot")
        self.notify("memory snapshot requested (next step boundary)", timeout=3)

    def action_who_holds(self: Any) -> None:
        """`w`: who holds memory. The training thread looks at the next step boundary and
        again a few steps later (probes/instruments/culprits); the answer is a leak_culprit
        event, shown in the culprit box."""
        if self._run_over():
            return
        if not self.can("who_holds"):
            self.notify("this run cannot look for holders (its leak watch is off)", timeout=4)
            return
        self.send("who_holds")
        self.culprit_box.looking()

    def action_stop_run(self: Any) -> None:
        """`x`: stop the run itself (a viewer's way; asks first)."""
        if self._run_over():
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.send("stop", reason="stopped from a viewer")
                self.notify("stop requested: the run ends at its next step boundary",
                            timeout=4)

        self.push_screen(ConfirmScreen("Stop the run at its next step boundary? (y/n)"),
                         answered)

    # views and files ----------------------------------------------------------------------------
    def action_sort(self: Any) -> None:
        """`o`: the sort of the table in view (narrow), else of the one that came last."""
        target = self.view if self.view in ("ops", "modules") else self._sort_target
        if target == "modules" and self.modules_table.loaded:
            self.modules_table.cycle_sort()
            return
        title = self.ops_table.cycle_sort()
        if title is None:
            if self.modules_table.loaded:
                self.modules_table.cycle_sort()
                return
            self.notify("no table to sort yet: p opens a profiler window, a a memory window",
                        timeout=3)

    def action_view(self: Any) -> None:
        """The next view of the lower area that looks different: from 100 columns the chart,
        top ops, modules and ledger show side by side, so `v` goes chart -> step split (->
        ranks); the modules view only once a memory window was asked for."""
        views = self.views
        if self.screen.has_class("-wide"):
            views = tuple(v for v in views if v not in SIDE_BY_SIDE)
        if not self.modules_table.has_class("-shown"):  # no window asked for yet (a)
            views = tuple(v for v in views if v != "modules")
        current = self.view if self.view in views else "chart"
        self.set_view(views[(views.index(current) + 1) % len(views)])

    def _check_role(self: Any) -> None:
        """When the run ends (or a viewer learns it is one) or a pause is asked for, the
        footer shows the keys that still do something; an ended run's leak banner and top
        ops say it has ended (tui/key_roles.py)."""
        role = key_role(self)
        keys = (role, self.want_paused)
        if keys == getattr(self, "_footer_keys", None):
            return
        self._footer_keys = keys
        self.refresh_bindings()
        if role == ENDED:
            self.leak_banner.run_ended()
            if not self.ops_table.ops:
                self.ops_table.set_note("no profiler window in this run (it has ended)")

    def check_action(self: Any, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The footer offers only the keys this dashboard's role can use (tui/key_roles.py)."""
        return action_shown(action, key_role(self), self.want_paused)

    def action_help(self: Any) -> None:
        """One HelpScreen per app, re-pushed (rebuilt only when what it says changed): an open
        is then a repaint, not a compose and a layout (benchmarks/RESULTS.md)."""
        if isinstance(self.screen, HelpScreen):
            return
        counters = self.run_state.counters
        role = key_role(self)
        screen = self._help_screen
        if screen is None or (screen.device_type, screen.counters, screen.role) != (
                self.device_type, counters, role):
            if screen is not None:
                self.uninstall_screen("help")
            screen = self._help_screen = HelpScreen(self.device_type, counters, role)
            self.install_screen(screen, name="help")
        self.push_screen("help")

    def action_screenshot(self: Any) -> None:
        """An SVG into the run folder; the counter keeps two presses in one second apart."""
        self._screenshots += 1
        name = (f"screenshot-{self._screenshots:03d}-step{self.run_state.step:06d}-"
                f"{time.strftime('%H%M%S')}.svg")
        self.redraw_chart()  # the newest points, built on the loop for this frame
        try:
            path = self.save_screenshot(filename=name, path=str(self.run_dir))
        except OSError as exc:  # disk full, read-only folder: the dashboard stays up
            self.notify(f"screenshot not saved: {exc.strerror or exc}", severity="error",
                        timeout=6)
            return
        self.notify(f"saved {Path(path).name} in the run folder", timeout=4)  # a path would
        # wrap mid-name in a toast; the status line says where the run folder is

    def action_report(self: Any) -> None:
        self.notify("writing the report…", timeout=2)
        self._report_worker()

    @work(thread=True, group="report", exclusive=True, exit_on_error=False)
    def _report_worker(self: Any) -> None:
        """Off the event loop; files only (any run folder); probes/analysis/report/build.py
        serialises writers."""
        from probes.analysis.report.build import write_report

        try:
            path = write_report(self.run_dir)
        except Exception as exc:  # the dashboard must survive a report bug
            self.call_from_thread(self.notify, f"report failed: {exc}", severity="error")
            return
        self._report_path = Path(path)
        if self.ending is not None:
            self.ending.report_path = Path(path)
        self.call_from_thread(self.notify, f"report written: {Path(path).name} and report.json "
                              "in the run folder", timeout=6)

    # quitting -------------------------------------------------------------------------------------
    def action_request_quit(self: Any) -> None:
        self.request_quit("stopped by user")

    def action_interrupt(self: Any) -> None:
        """Ctrl-C: the dashboard's terminal is in raw mode, so it comes as a key; it ends the run
        as SIGINT ends a headless one ("interrupted (SIGINT)", exit 130: README's exit table)."""
        self.signal_quit(signal.SIGINT)

    def request_quit(self: Any, reason: str) -> None:
        """memtop train: stop at the next step boundary, join off the event loop, write the
        report, exit (a second request leaves at once). memtop view: leave; the run goes on."""
        if self.ending is None:
            code = self.exit_code()
            self.exit(code, return_code=code)
            return
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

    def _exit_after_quit(self: Any) -> None:
        if not self._quit_forced:
            code = self.exit_code()
            self.exit(code, return_code=code)

    def _on_loop(self: Any, callback: Callable[..., Any], *args: Any) -> None:
        """Run ``callback`` on the app's message pump, from any thread or a signal handler.

        call_soon_threadsafe only appends to the loop's queue and wakes its selector (safe
        between two bytecodes of the main thread); call_later then runs the callback inside
        Textual's context. Nothing happens once the loop has closed.
        """
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self.call_later, callback, *args)

    def signal_quit(self: Any, signum: int) -> None:
        """After SIGTERM/SIGHUP/SIGINT or a lost terminal (tui/exit_guard.py calls it from its
        own thread): ask for the same clean quit as `q` (twice: at once)."""
        if self.quit_signal is None:
            self.quit_signal = signum
        if self._loop is None:
            self._early_signal = signum  # on_mount acts on it
        else:
            self._on_loop(self._quit_for_signal, signum)

    def _quit_for_signal(self: Any, signum: int) -> None:
        self.request_quit(f"interrupted ({signal.Signals(signum).name})")

    @property
    def finished(self: Any) -> bool:
        return self.ending.finished if self.ending is not None else True

    @property
    def report_path(self: Any) -> Path | None:
        return self.ending.report_path if self.ending is not None else self._report_path

    def exit_code(self: Any) -> int:
        """A signal (or Ctrl-C) that asked for the quit: 128 + its number, as headless runs
        exit (tui/headless.py); else the run's own status (0 for a viewer)."""
        if self.quit_signal is not None:
            return 128 + self.quit_signal
        return self.ending.exit_code() if self.ending is not None else 0

    def shutdown(self: Any, timeout_s: float = 10.0, out: TextIO | None = None) -> None:
        """After the app has gone (whatever the way): stop and join the trainer, finish the run."""
        if self.ending is not None:
            self.ending.shutdown(timeout_s, out)
        if self._gc_frozen:
            gc.unfreeze()
            self._gc_frozen = False
