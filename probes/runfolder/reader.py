"""A run folder read back: config.json as written, every row of a metrics file, and the quick
opening of a long run for a viewer (events, the last steps, a thinned series for the chart)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probes.records import Record, mark_disturbed, record_from_json, step_row_problem
from probes.runfolder.layout import CONFIG, RunFolderError


def read_config(run_dir: Path) -> dict[str, Any]:
    """config.json as written (any memtop version, any machine); {} when absent or junk (a
    viewer shows what it can)."""
    try:
        return require_config(run_dir)
    except RunFolderError:
        return {}


def require_config(run_dir: Path) -> dict[str, Any]:
    """config.json as written; RunFolderError (one sentence) when it is absent, not JSON or not
    a JSON object (the report, which cannot describe a run without it)."""
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        raise RunFolderError(f"{run_dir} has no {CONFIG}: not a memtop run folder")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
        raise RunFolderError(f"{path} is not valid JSON ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise RunFolderError(f"{path} is not a JSON object")
    return data


@dataclass
class Rows:
    """What a metrics file held: parsed rows in order, and what could not be read."""

    rows: list[dict[str, Any]]
    bad: int = 0  # lines that are not a valid step row or event row (``parse_row``)
    truncated: bool = False  # the last line was cut short (the writer was killed mid-line)
    first_bad: str | None = None  # "line N: why" of the first bad line, for the reader to say

    @property
    def steps(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if "event" not in r]

    @property
    def events(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if "event" in r]

    def records(self) -> list[Record]:
        return [record_from_json(r) for r in self.rows]


def parse_row(line: bytes | str) -> dict[str, Any] | str:
    """One line -> a step or event row, or why it is a bad line: not JSON, not an object, no
    step or event, or a step row whose values break the schema (records.step_row_problem:
    wrong types, negative bytes, non-finite counters)."""
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: thousands of nested brackets
        return "not JSON"
    if not isinstance(row, dict):
        return "not a JSON object"
    if isinstance(row.get("event"), str):
        return row
    if "event" in row:
        return "an event that is not named by a string"
    problem = step_row_problem(row)
    return row if problem is None else problem


def parse_line(line: bytes | str) -> dict[str, Any] | None:
    """One line -> a step or event row; None for a bad line (``parse_row`` says why)."""
    row = parse_row(line)
    return row if isinstance(row, dict) else None


def read_rows(path: Path) -> Rows:
    """Every row of a metrics file; RunFolderError when it cannot be read at all."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise RunFolderError(f"cannot read {path}: {exc.strerror or exc}") from None
    out = Rows([])
    last_bad = False
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        row = parse_row(line)
        last_bad = not isinstance(row, dict)
        if isinstance(row, dict):
            out.rows.append(row)
        else:
            out.bad += 1
            if out.first_bad is None:
                out.first_bad = f"line {number}: {row}"
    out.truncated = bool(raw) and (last_bad or not raw.endswith(b"\n"))
    mark_disturbed(out.rows)  # an older folder's rows, by today's rule (records/disturbed.py)
    return out


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(step rows, event rows, unreadable lines) of a metrics file."""
    rows = read_rows(path)
    return rows.steps, rows.events, rows.bad


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
    mark_disturbed(rows)  # every event is here: the tail's steps are marked as a full read's
    chart = [parsed[k] for k in sorted(chart_at) if k in parsed and "event" not in parsed[k]]
    return History(rows, chart, steps_total, bad, end)


def _blank_lines(raw: bytes, end: int) -> int:
    """Empty lines up to ``end`` (a writer never makes them; a hand-edited file may)."""
    return raw.count(b"\n\n", 0, end) + (1 if raw[:1] == b"\n" else 0)
