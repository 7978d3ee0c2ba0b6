"""One thread per run: what the trainer, the inference runner and the dashboard's deferred
trainer share — start the run on a daemon thread, join it with a timeout, ask if it is alive.
All torch work stays on that thread (docs/ARCHITECTURE.md, data flow)."""

from __future__ import annotations

import threading


class BackgroundRun:
    """Subclasses set ``thread_name`` and implement ``_thread_main``."""

    thread_name = "memtop-run"
    _thread: threading.Thread | None = None

    def _thread_main(self) -> object:
        raise NotImplementedError

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self._thread_main, name=self.thread_name,
                                        daemon=True)
        self._thread.start()
        return self._thread

    def join(self, timeout: float | None = None) -> bool:
        """True when the run's thread has ended (or never started)."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
