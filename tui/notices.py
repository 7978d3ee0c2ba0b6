"""The notices the dashboard has shown, kept to be read back.

Textual keeps only the toasts still on screen, in a private list. The app keeps the last
NOTICES_KEPT it showed, in order and whatever their timeout: what a "recent messages" view would
list, and what tests read to check what a user was told (tests/unit/test_app.py).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from textual.notifications import SeverityLevel

NOTICES_KEPT = 50


@dataclass(frozen=True)
class Notice:
    """One toast, as it was shown."""

    title: str
    message: str
    severity: SeverityLevel


class NoticeLog:
    """Mixed into MemtopApp: every ``notify`` is shown and kept in :attr:`notices`."""

    def _init_notices(self: Any) -> None:
        self._notices: deque[Notice] = deque(maxlen=NOTICES_KEPT)
        self._notices_lock = threading.Lock()  # notify may be called from any thread

    def notify(self: Any, message: str, *, title: str = "",
               severity: SeverityLevel = "information", timeout: float | None = None,
               markup: bool = False) -> None:
        """Shown and kept. Plain text unless ``markup``: memtop's toasts carry the run's own
        words (paths, op names, exception messages), which Textual would read as markup."""
        with self._notices_lock:
            self._notices.append(Notice(title, message, severity))
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)

    @property
    def notices(self: Any) -> tuple[Notice, ...]:
        """The last NOTICES_KEPT notices shown, oldest first."""
        with self._notices_lock:
            return tuple(self._notices)
