"""A metrics file followed live while another process appends to it (memtop view, runs)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from probes.runfolder.reader import parse_line


class Follower:
    """Tails one metrics file as another process appends to it.

    ``poll()`` returns the complete rows added since the last call. A last line without its
    newline is being written: it is kept back until the newline comes, never parsed half. A
    junk line is counted in ``bad`` and skipped. A file that disappears (deleted, or replaced by
    another file) sets ``gone``: the caller keeps what it has.
    """

    CHUNK = 1 << 20

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = Path(path)
        self.offset = offset
        self.bad = 0
        self.gone = False
        self._partial = b""
        self._ino: int | None = None
        self._fh: Any = None

    def _open(self) -> bool:
        if self._fh is not None:
            return True
        try:
            self._fh = open(self.path, "rb")
        except OSError:
            return False
        self._ino = os.fstat(self._fh.fileno()).st_ino
        self._fh.seek(self.offset)
        return True

    def _check_gone(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError:
            self.gone = True
            return
        if self._ino is not None and st.st_ino != self._ino:
            self.gone = True

    def poll(self, max_bytes: int | None = None) -> list[dict[str, Any]]:
        if self.gone or not self._open():
            return []
        self._check_gone()
        data = self._fh.read(max_bytes if max_bytes is not None else -1)
        if not data:
            return []
        self.offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()  # b"" when the data ended on a newline
        rows: list[dict[str, Any]] = []
        for line in lines:
            if not line.strip():
                continue
            row = parse_line(line)
            if row is None:
                self.bad += 1
            else:
                rows.append(row)
        return rows

    @property
    def waiting_for_newline(self) -> bool:
        return bool(self._partial)

    def close(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None
