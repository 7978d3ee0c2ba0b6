"""Reading a process tree from /proc, torch-free: each process's name, state, parent, start
time and exit status (``/proc/PID/stat``), its RSS, PSS and USS (``/proc/PID/smaps_rollup``; RSS
from ``statm`` where the kernel has no rollup), its command line, and a process's children (the
kernel's per-task child lists, else a pass over every ``/proc/PID/stat``). The workers' sampler
(probes/counters/workers.py) is built on these; every reader returns None for a process that is
gone or not ours to read, never raises.
"""

from __future__ import annotations

import os

PROC = "/proc"
MAX_DEPTH = 4  # a worker's own children are the worker's; deeper trees stop here
_ROLLUP_KEYS = {b"Rss:": 0, b"Pss:": 1, b"Private_Clean:": 2, b"Private_Dirty:": 3}
Memory = tuple[int | None, int | None, int | None]  # (RSS, PSS, USS) bytes


def read_stat(pid: int) -> tuple[str, str, int, int, int | None] | None:
    """(comm, state, ppid, start time in ticks, exit code field) of ``pid``; None when gone."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    return parse_stat(raw)


def parse_stat(raw: bytes) -> tuple[str, str, int, int, int | None] | None:
    """``/proc/<pid>/stat``'s comm, state, ppid, starttime and exit_code (Linux ≥ 3.5)."""
    open_at, close_at = raw.find(b"("), raw.rfind(b")")
    if open_at < 0 or close_at < 0:
        return None
    rest = raw[close_at + 2:].split()
    try:
        exit_code = int(rest[49]) if len(rest) > 49 else None
        return (raw[open_at + 1:close_at].decode("utf-8", "replace"), rest[0].decode(),
                int(rest[1]), int(rest[19]), exit_code)
    except (IndexError, ValueError):
        return None


def exit_text(code: int | None) -> str | None:
    """A wait status as words: "exit 0", "exit 1", "killed by signal 9"."""
    if code is None:
        return None
    if code & 0x7F:
        return f"killed by signal {code & 0x7F}"
    return f"exit {(code >> 8) & 0xFF}"


def parse_rollup(raw: bytes) -> tuple[int, int, int] | None:
    """(RSS, PSS, USS) in bytes from smaps_rollup's text; None when a field is missing."""
    found = [0, 0, 0, 0]
    seen = 0
    for line in raw.splitlines():
        key, _, rest = line.partition(b" ")
        at = _ROLLUP_KEYS.get(key)
        if at is None:
            continue
        try:
            found[at] = int(rest.split()[0]) * 1024
        except (IndexError, ValueError):
            return None
        seen += 1
    if seen < len(_ROLLUP_KEYS):
        return None
    return found[0], found[1], found[2] + found[3]


def read_memory(pid: int, page: int) -> tuple[int | None, int | None, int | None] | None:
    """(RSS, PSS, USS) of ``pid``: smaps_rollup, else RSS alone from statm; None when gone."""
    try:
        with open(f"{PROC}/{pid}/smaps_rollup", "rb") as fh:
            rolled = parse_rollup(fh.read())
        if rolled is not None:
            return rolled
    except FileNotFoundError:
        pass  # no smaps_rollup (kernel < 4.14, some sandboxes): statm has RSS
    except OSError:
        return None  # gone, or not ours to read
    try:
        with open(f"{PROC}/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * page, None, None
    except (OSError, IndexError, ValueError):
        return None


def read_cmdline(pid: int) -> bytes:
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as fh:
            return fh.read(4096)
    except OSError:
        return b""


def added(a: tuple[int | None, int | None, int | None],
           b: tuple[int | None, int | None, int | None] | None
           ) -> tuple[int | None, int | None, int | None]:
    """Two processes' (RSS, PSS, USS) summed; a process gone meanwhile (None) adds nothing."""
    if b is None:
        return a
    return tuple(x + y if x is not None and y is not None else None  # type: ignore[return-value]
                 for x, y in zip(a, b, strict=True))


class ChildLister:
    """Lists a process's children: the kernel's per-task lists where it keeps them, else a
    pass over every process's stat (its ppid)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.per_task = os.path.exists(f"{PROC}/{root}/task/{root}/children")
        self.how = ("/proc/PID/task/TID/children" if self.per_task
                    else "a pass over /proc/*/stat (the kernel keeps no child lists)")

    def children_map(self) -> dict[int, list[int]]:
        """ppid -> its children's pids, for ``root``'s descendants (per-task lists) or for
        every process (the /proc pass)."""
        return self._from_tasks() if self.per_task else self._from_scan()

    def _from_tasks(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        todo, depth = [self.root], 0
        while todo and depth <= MAX_DEPTH:
            nxt = []
            for pid in todo:
                kids = []
                try:
                    tasks = os.listdir(f"{PROC}/{pid}/task")
                except OSError:
                    continue
                for tid in tasks:
                    try:
                        with open(f"{PROC}/{pid}/task/{tid}/children", "rb") as fh:
                            kids += [int(x) for x in fh.read().split()]
                    except (OSError, ValueError):
                        continue
                if kids:
                    out[pid] = kids
                    nxt += kids
            todo, depth = nxt, depth + 1
        return out

    @staticmethod
    def _from_scan() -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        try:
            entries = os.scandir(PROC)
        except OSError:
            return out
        with entries:
            for entry in entries:
                name = entry.name
                if not name.isdigit():
                    continue
                try:
                    with open(f"{PROC}/{name}/stat", "rb") as fh:
                        raw = fh.read()
                    ppid = int(raw[raw.rfind(b")") + 2:].split(maxsplit=2)[1])
                except (OSError, IndexError, ValueError):
                    continue
                out.setdefault(ppid, []).append(int(name))
        return out
