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
    junk line is counted in ``bad`` and skipped, and so is a line longer than MAX_LINE_BYTES
    (a writer that never ends its line cannot grow the buffer without bound). A file that
    disappears (deleted, or replaced by another file) sets ``gone``: the caller keeps what it
    has. A file cut back in place is read again from its new start (``truncations`` counts it);
    one that is cut back and grows past the old offset between two polls cannot be told from
    one that grew, and reads on from the old offset (its first line then counts as bad).
    """

    CHUNK = 1 << 20
    MAX_LINE_BYTES = 8 << 20  # a row is ~1 KB, an event with a top-ops table ~30 KB

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = Path(path)
        self.offset = offset
        self.bad = 0
        self.gone = False
        self.truncations = 0  # times the file was cut back in place (`: >`, copytruncate)
        self._partial = b""
        self._skipping = False  # inside a line longer than MAX_LINE_BYTES: drop to its end
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

    def _check_file(self) -> None:
        """Gone (deleted, or replaced by another file), or cut back in place: a file shorter
        than what was read has been truncated (logrotate's copytruncate, `: > metrics.jsonl`),
        and what its writer appends next starts at offset 0, so reading goes on from there."""
        try:
            st = os.stat(self.path)
        except OSError:
            self.gone = True
            return
        if self._ino is not None and st.st_ino != self._ino:
            self.gone = True
        elif st.st_size < self.offset:
            self.truncations += 1
            self.offset = 0
            self._partial, self._skipping = b"", False
            self._fh.seek(0)

    def poll(self, max_bytes: int | None = None) -> list[dict[str, Any]]:
        if self.gone or not self._open():
            return []
        self._check_file()
        if self.gone:
            return []
        data = self._fh.read(max_bytes if max_bytes is not None else -1)
        if not data:
            return []
        self.offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()  # b"" when the data ended on a newline
        if self._skipping and lines:
            lines.pop(0)  # the end of the overlong line
            self._skipping = False
        if len(self._partial) > self.MAX_LINE_BYTES:  # a line that never ends: not kept
            if not self._skipping:
                self.bad += 1
            self._partial, self._skipping = b"", True
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

    @property
    def buffered_bytes(self) -> int:
        """Bytes of a line not ended yet, held until its newline comes (≤ MAX_LINE_BYTES plus
        one read)."""
        return len(self._partial)

    def close(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None
