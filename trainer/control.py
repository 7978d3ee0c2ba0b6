"""The one small thread-safe object through which the UI (or a signal handler) steers the trainer.

Every request is acted on at the next step boundary, never in the middle of a step.
"""

from __future__ import annotations

import threading


class TrainControl:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = threading.Event()  # set = not paused
        self._running.set()
        self._stop = threading.Event()
        self._profile_requests = 0
        self._leak_toggles = 0
        self.stop_reason: str | None = None

    # pause / resume / stop -------------------------------------------------------------------
    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def toggle_pause(self) -> bool:
        """Flip pause; returns True when now paused."""
        with self._lock:
            if self._running.is_set():
                self._running.clear()
                return True
            self._running.set()
            return False

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def stop(self, reason: str = "stopped by user") -> None:
        with self._lock:
            if self.stop_reason is None:
                self.stop_reason = reason
        self._stop.set()
        self._running.set()  # a paused trainer must wake up to see the stop

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def wait_while_paused(self, timeout_s: float = 0.1) -> bool:
        """Block the trainer while paused; returns True when it may run a step."""
        while not self._running.wait(timeout_s):
            if self._stop.is_set():
                return False
        return not self._stop.is_set()

    # requests counted so that two quick presses are two requests -----------------------------
    def request_profile(self) -> None:
        """Open a profiler window, or cancel the one that is open."""
        with self._lock:
            self._profile_requests += 1

    def toggle_leak(self) -> None:
        with self._lock:
            self._leak_toggles += 1

    def take_requests(self) -> tuple[int, int]:
        """(profile, leak) requests since the last call; the trainer calls this at each step."""
        with self._lock:
            taken = (self._profile_requests, self._leak_toggles)
            self._profile_requests = self._leak_toggles = 0
        return taken
