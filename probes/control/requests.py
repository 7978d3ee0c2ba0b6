"""The one small thread-safe object through which a run is steered: the dashboard's keys, a
signal handler, a viewer's request through the run's socket (probes/control/unix_socket.py).

Requests are queued and taken by the training thread at a step boundary, never mid-step. A
request may name the step before which it is acted on (``at_step``): several ranks that get the
same request with the same step act on it together, with no collective added to every step.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

# What may be requested. Explicit verbs, not toggles: two viewers pressing `p` at once must not
# open and cancel the same window.
REQUESTS = ("profile", "profile_cancel", "leak_start", "leak_stop", "pause", "resume",
            "report", "stop", "memory_snapshot", "who_holds", "attribute", "attribute_cancel")


@dataclass(frozen=True)
class Request:
    kind: str  # one of REQUESTS
    at_step: int | None = None  # act at the boundary before this step; None: the next one
    source: str = "keyboard"  # who asked: keyboard, signal, viewer pid N, launcher ...
    reason: str | None = None  # for stop: why (shown in run_finished)

    def __post_init__(self) -> None:
        if self.kind not in REQUESTS:
            raise ValueError(f"unknown request {self.kind!r}; use one of {', '.join(REQUESTS)}")
        if self.at_step is not None and (not isinstance(self.at_step, int)
                                         or isinstance(self.at_step, bool) or self.at_step < 1):
            raise ValueError(f"at_step must be a positive step number, got {self.at_step!r}")


class RunControl:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = threading.Event()  # set = not paused
        self._running.set()
        self._stop = threading.Event()
        self._queue: list[Request] = []
        self.stop_reason: str | None = None
        self.urgent = False  # the process is leaving (a signal, the terminal gone): no waiting
        self.paused_by: str | None = None  # who asked for the pause in effect

    # requests ----------------------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        """Queue a request for the training thread. A stop also wakes a paused trainer."""
        with self._lock:
            self._queue.append(request)
        if request.kind in ("stop", "resume") and request.at_step is None:
            self._running.set()  # a paused trainer must wake up to see it

    def take_due(self, step: int) -> list[Request]:
        """Requests to act on at the boundary before ``step``, oldest first."""
        if not self._queue:  # the usual step (issue 28): no lock; a request submitted right
            return []  # now is taken at the next boundary, as if it came a moment later
        with self._lock:
            if not self._queue:
                return []
            due = [r for r in self._queue if r.at_step is None or r.at_step <= step]
            self._queue = [r for r in self._queue if r not in due]
        return due

    def request_profile(self, source: str = "keyboard") -> None:
        self.submit(Request("profile", source=source))

    def cancel_profile(self, source: str = "keyboard") -> None:
        self.submit(Request("profile_cancel", source=source))

    def request_attribution(self, source: str = "keyboard") -> None:
        """A memory attribution window (probes/instruments/attribution.py)."""
        self.submit(Request("attribute", source=source))

    def cancel_attribution(self, source: str = "keyboard") -> None:
        self.submit(Request("attribute_cancel", source=source))

    def start_leak(self, source: str = "keyboard") -> None:
        self.submit(Request("leak_start", source=source))

    def stop_leak(self, source: str = "keyboard") -> None:
        self.submit(Request("leak_stop", source=source))

    # pause / stop: acted on at once by the waiting trainer --------------------------------------
    def pause(self, source: str = "keyboard") -> None:
        """Pause at the next boundary; ``source`` (keyboard, viewer pid N, socket...) is what
        the paused event says paused it."""
        self.paused_by = source
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def stop(self, reason: str = "stopped by user", urgent: bool = False) -> None:
        """Stop at the next step boundary (the first reason given is the one kept).

        ``urgent``: the process must end within seconds, so instruments drop work they would
        otherwise finish at the end of the run (a profiler table being analysed)."""
        with self._lock:
            if self.stop_reason is None:
                self.stop_reason = reason
            self.urgent = self.urgent or urgent
        self._stop.set()
        self._running.set()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def wait_while_paused(self, timeout_s: float = 0.1) -> bool:
        """Block the training thread while paused; True when it may run a step."""
        while not self._running.wait(timeout_s):
            if self._stop.is_set():
                return False
        return not self._stop.is_set()
