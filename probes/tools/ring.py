"""A bounded, thread-safe hand-over buffer between the trainer thread and the UI timer."""

from __future__ import annotations

import threading
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Ring(Generic[T]):
    """The producer appends (never blocks); the consumer drains everything new on its own clock.

    When the consumer falls behind, the oldest items are dropped and counted: memory stays bounded
    however long the run.
    """

    def __init__(self, maxlen: int = 4096) -> None:
        self._items: deque[T] = deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self.dropped = 0

    def push(self, item: T) -> None:
        with self._lock:
            if len(self._items) == self._items.maxlen:
                self.dropped += 1
            self._items.append(item)

    def drain(self) -> list[T]:
        with self._lock:
            items = list(self._items)
            self._items.clear()
        return items

    def __len__(self) -> int:
        return len(self._items)
