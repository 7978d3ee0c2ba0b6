"""The run folder: its paths, atomic writes, the metrics writer, and reading it back (whole or
followed live). The one module that knows the folder's layout (docs/ARCHITECTURE.md):

    runs/<YYYYmmdd-HHMMSS>-<id>/      never reused, never overwritten
      config.json                     the options as given (rank 0 writes it)
      metrics.jsonl                   one JSON object a line: step rows and event rows
      metrics-rank-K.jsonl            instead, one file per rank when several processes write
      control.sock / control-rank-K.sock   the live run's request socket (mode 0600)
      profiles/step-N/[rank-K/]       trace.json, top_ops.txt/json, window.json
      report.md, report.json          written at the end, on request, or by `memtop report`
      weights.pt                      `memtop train`'s weights at the end (memtop header +
                                      state_dict; read with torch.load(weights_only=True))
      stderr.log                      what libraries printed while the dashboard owned the tty
      torchrun.log                    torch.distributed.run's output (memtop train --nproc N)
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probes.errors import MemtopError
from probes.records import Event, Record, StepSample, record_from_json

CONFIG = "config.json"
METRICS = "metrics.jsonl"
REPORT_MD = "report.md"
REPORT_JSON = "report.json"
STDERR_LOG = "stderr.log"
TORCHRUN_LOG = "torchrun.log"  # torch.distributed.run's own output under `memtop train --nproc`
PROFILES = "profiles"
WEIGHTS = "weights.pt"
_RANK_FILE = re.compile(r"^metrics-rank-(\d+)\.jsonl$")


class RunFolderError(MemtopError, ValueError):
    """The run folder cannot be created, written or read as one (bad input: exit 2)."""


RunDirError = RunFolderError  # the name callers used before this module owned the folder


# ---- paths ---------------------------------------------------------------------------------------
def metrics_name(rank: int | None) -> str:
    """metrics.jsonl for a lone process; metrics-rank-K.jsonl when ranks write side by side."""
    return METRICS if rank is None else f"metrics-rank-{rank}.jsonl"


def socket_name(rank: int | None) -> str:
    return "control.sock" if rank is None else f"control-rank-{rank}.sock"


def profile_dir(run_dir: Path, first_step: int, rank: int | None = None) -> Path:
    """profiles/step-N/ (or profiles/step-N/rank-K/ under several ranks)."""
    path = Path(run_dir) / PROFILES / f"step-{first_step}"
    return path / f"rank-{rank}" if rank is not None else path


def weights_path(run_dir: Path) -> Path:
    return Path(run_dir) / WEIGHTS


def find_weights(path: str | os.PathLike[str]) -> Path:
    """A weights file given as itself or as the run folder holding weights.pt."""
    path = Path(path)
    if not path.exists():
        raise RunFolderError(f"{path} does not exist")
    if path.is_dir():
        if not weights_path(path).is_file():
            raise RunFolderError(f"{path} has no {WEIGHTS} (runs save it at the end unless "
                                 "--no-save-weights; inference runs have none)")
        return weights_path(path)
    return path


def metrics_files(run_dir: Path) -> dict[int | None, Path]:
    """The metrics files a run folder holds: {None: metrics.jsonl} or {rank: metrics-rank-K}."""
    run_dir = Path(run_dir)
    found: dict[int | None, Path] = {}
    if (run_dir / METRICS).is_file():
        found[None] = run_dir / METRICS
    with contextlib.suppress(OSError):
        for entry in os.scandir(run_dir):
            match = _RANK_FILE.match(entry.name)
            if match:
                found[int(match.group(1))] = Path(entry.path)
    return dict(sorted(found.items(), key=lambda kv: -1 if kv[0] is None else kv[0]))


def is_run_folder(path: Path) -> bool:
    path = Path(path)
    return path.is_dir() and ((path / CONFIG).is_file() or bool(metrics_files(path)))


def check_run_folder(path: str | os.PathLike[str]) -> Path:
    """``path`` if it is a run folder, else RunFolderError with one sentence."""
    path = Path(path)
    if not path.exists():
        raise RunFolderError(f"{path} does not exist")
    if not path.is_dir():
        raise RunFolderError(f"{path} is not a folder")
    if not is_run_folder(path):
        raise RunFolderError(f"{path} is not a memtop run folder (no config.json or "
                             "metrics.jsonl)")
    return path


def read_config(run_dir: Path) -> dict[str, Any]:
    """config.json as written (any memtop version, any machine); {} when absent or junk."""
    try:
        data = json.loads((Path(run_dir) / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def find_runs(root: str | os.PathLike[str]) -> list[Path]:
    """Run folders directly under ``root``, oldest first (names start with their start time)."""
    root = Path(root)
    try:
        entries = [Path(e.path) for e in os.scandir(root) if e.is_dir()]
    except OSError:
        return []
    return sorted((p for p in entries if is_run_folder(p)), key=lambda p: p.name)


def resolve_run(path: str | os.PathLike[str]) -> Path:
    """A run folder, or the newest run in a folder of runs; RunFolderError otherwise."""
    path = Path(path)
    if not path.exists():
        raise RunFolderError(f"{path} does not exist")
    if is_run_folder(path):
        return path
    runs = find_runs(path)
    if not runs:
        raise RunFolderError(f"{path} is neither a memtop run folder nor a folder of runs")
    return runs[-1]


# ---- creating and writing ------------------------------------------------------------------------
def create_run_dir(root: str | os.PathLike[str]) -> Path:
    """Make ``root/<YYYYmmdd-HHMMSS>-<id>/``; the random id keeps two runs in one second apart."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        msg = (f"cannot create run directory root {root}: {exc.strerror or exc}; "
               "pass --run-dir DIR to write elsewhere")
        raise RunFolderError(msg) from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise RunFolderError(f"run directory root {root} is not writable; pass --run-dir DIR")
    for _ in range(10):
        path = root / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
        except OSError as exc:
            msg = f"cannot create run directory {path}: {exc.strerror or exc}"
            raise RunFolderError(msg) from None
    raise RunFolderError(f"could not find a fresh run directory name under {root}")


def _json_safe(value: Any) -> Any:
    """JSON has no inf/nan: write them as null so every line stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_text(path: Path, text: str) -> None:
    """Write a whole file atomically (unique temp file + rename): a reader or a crash never
    sees half a file, and two writers never share one temp file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temp path beside ``path`` to write to; renamed onto ``path`` when the block succeeds,
    removed when it fails (for writers that want a file name, such as torch.save)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: Path, obj: Any) -> None:
    """A whole JSON file, atomically (see write_text); inf/nan become null."""
    write_text(path, json.dumps(_json_safe(obj), indent=2, default=str) + "\n")


def json_line(row: dict[str, Any]) -> str:
    """One metrics.jsonl line (without the newline)."""
    try:  # the usual row has no inf/nan: encoded as is (the per-step path, no copy)
        return json.dumps(row, separators=(",", ":"), default=str, allow_nan=False)
    except ValueError:
        return json.dumps(_json_safe(row), separators=(",", ":"), default=str)


class MetricsWriter:
    """Appends one JSON object per line and flushes each line; safe to call from any thread.

    A killed process loses at most the line being written; every earlier line is complete.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fh = open(self.path, "a", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()

    def write_row(self, row: dict[str, Any]) -> None:
        line = json_line(row) + "\n"
        with self._lock:
            self._fh.write(line)
            self._fh.flush()

    def write(self, record: Record) -> None:
        self.write_row(record.to_json())

    # the names older callers use
    def write_sample(self, sample: StepSample) -> None:
        self.write(sample)

    def write_event(self, event: Event) -> None:
        self.write(event)

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                with contextlib.suppress(OSError):
                    self._fh.close()


# ---- reading back --------------------------------------------------------------------------------
@dataclass
class Rows:
    """What a metrics file held: parsed rows in order, and what could not be read."""

    rows: list[dict[str, Any]]
    bad: int = 0  # lines that are not a JSON object with a step or an event
    truncated: bool = False  # the last line was cut short (the writer was killed mid-line)

    @property
    def steps(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if "event" not in r]

    @property
    def events(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if "event" in r]

    def records(self) -> list[Record]:
        return [record_from_json(r) for r in self.rows]


def parse_line(line: bytes | str) -> dict[str, Any] | None:
    """One line -> a step or event row; None for junk (not JSON, not an object, no step)."""
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: thousands of nested brackets
        return None
    if not isinstance(row, dict):
        return None
    if isinstance(row.get("event"), str):
        return row
    step = row.get("step")
    if "event" not in row and isinstance(step, int) and not isinstance(step, bool):
        return row
    return None


def read_rows(path: Path) -> Rows:
    """Every row of a metrics file; RunFolderError when it cannot be read at all."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise RunFolderError(f"cannot read {path}: {exc.strerror or exc}") from None
    out = Rows([])
    last_bad = False
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        row = parse_line(line)
        last_bad = row is None
        if row is None:
            out.bad += 1
        else:
            out.rows.append(row)
    out.truncated = bool(raw) and (last_bad or not raw.endswith(b"\n"))
    return out


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(step rows, event rows, unreadable lines) of a metrics file."""
    rows = read_rows(path)
    return rows.steps, rows.events, rows.bad


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


@dataclass
class History:
    """A metrics file read for a viewer: every event and the last steps in full, in file
    order (``rows``), a thinned step series over the whole run for the chart, and ``end``, the
    offset where a Follower continues."""

    rows: list[dict[str, Any]]
    chart_steps: list[dict[str, Any]]
    steps_total: int
    bad: int
    end: int


def read_history(path: Path, keep_last: int = 512, chart_points: int = 512) -> History:
    """Open a long run quickly: only event rows, the last ``keep_last`` step rows and about
    ``chart_points`` step rows at evenly spaced offsets are parsed; the file is never split into
    lines (a 100,000-step file is ~40 MB): event lines are found by searching for the
    ``"event"`` key, and the step lines are counted, not read.

    A last line still being written is left for the follower.
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise RunFolderError(f"cannot read {path}: {exc.strerror or exc}") from None
    end = raw.rfind(b"\n") + 1
    events: dict[int, bytes] = {}  # line start -> line, for every line naming "event"
    pos = raw.find(b'"event"', 0, end)
    while pos >= 0:
        start = raw.rfind(b"\n", 0, pos) + 1
        stop = raw.find(b"\n", pos, end)
        events[start] = raw[start:stop]
        pos = raw.find(b'"event"', stop, end)
    lines_total = raw.count(b"\n", 0, end) - _blank_lines(raw, end)
    steps_total = lines_total - len(events)

    def step_line_at(offset: int) -> tuple[int, bytes] | None:
        """The first non-event, non-blank line starting at or after ``offset``."""
        while offset < end:
            stop = raw.find(b"\n", offset, end)
            line = raw[offset:stop]
            if offset not in events and line.strip():
                return offset, line
            offset = stop + 1
        return None

    tail: dict[int, bytes] = {}  # the last keep_last step lines, by their start
    stop = end - 1
    while keep_last > 0 and stop > 0 and len(tail) < keep_last:
        start = raw.rfind(b"\n", 0, stop) + 1
        if start not in events and raw[start:stop].strip():
            tail[start] = raw[start:stop]
        stop = start - 1
    chart_at: dict[int, bytes] = {}
    if steps_total > 0 and chart_points > 0:
        every = max(1, end // chart_points) if steps_total > chart_points else 1
        offset = 0
        while offset < end:
            found = step_line_at(offset)
            if found is None:
                break
            chart_at[found[0]] = found[1]
            offset = found[0] + len(found[1]) + 1
            if every > 1:
                offset = max(offset, raw.rfind(b"\n", 0, found[0] + every) + 1)
    bad = 0
    parsed: dict[int, dict[str, Any]] = {}
    for start in sorted(set(events) | set(tail) | set(chart_at)):
        row = parse_line(events.get(start) or tail.get(start) or chart_at[start])
        if row is None:
            bad += 1
        else:
            parsed[start] = row
    rows = [parsed[k] for k in sorted(parsed) if k in events or k in tail]
    chart = [parsed[k] for k in sorted(chart_at) if k in parsed and "event" not in parsed[k]]
    return History(rows, chart, steps_total, bad, end)


def _blank_lines(raw: bytes, end: int) -> int:
    """Empty lines up to ``end`` (a writer never makes them; a hand-edited file may)."""
    return raw.count(b"\n\n", 0, end) + (1 if raw[:1] == b"\n" else 0)


def iter_records(path: Path) -> Iterator[Record]:
    """Every readable record of a metrics file, in order (junk skipped)."""
    for row in read_rows(path).rows:
        try:
            yield record_from_json(row)
        except ValueError:
            continue
