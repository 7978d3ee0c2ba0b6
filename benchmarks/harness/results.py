"""The results writer: RESULTS.md is one table, one row per figure, and each run of a case also
leaves a dated section in results/YYYY-MM-DD.md (its machine, command and whole output).

A case hands ``publish`` its figures (``Figure``: an id such as ``step_overhead/gpt``, what it
is, the target, the latest value with its band, the status) and the section's text. Unless
--no-append, each figure's row is rewritten in place (or added at the end of the table) with
the date, the machine (machine.Machine.short), the command that reproduces it and a link to
the day's log; every other row and line of RESULTS.md is left as it was.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Iterable
from pathlib import Path

from benchmarks.harness.paths import LOGS, RESULTS

COLUMNS = ("figure", "what", "target", "latest (band)", "status", "date", "machine", "command",
           "log")
HEADER = "| " + " | ".join(COLUMNS) + " |"
RULE = "|" + "---|" * len(COLUMNS)
STATUSES = ("met", "missed", "inside noise", "not judged", "NOT RUN")


def status_of(verdict: str) -> str:
    """A verdict as the harness words it ("inside noise (cannot tell)", "MISSED", "not judged
    (6 pairs < 7)", "n/a") in the table's few words."""
    v = verdict.strip().lower()
    for status in STATUSES:
        if v.startswith(status.lower()):
            return status
    return "NOT RUN" if v in ("", "n/a", "not run") else "missed" if "miss" in v else "met"


@dataclasses.dataclass(frozen=True)
class Figure:
    """One row of RESULTS.md: ``id`` names it (case/figure, or gpu/claim)."""

    id: str
    what: str
    target: str
    value: str
    status: str  # a verdict; written as one of STATUSES
    command: str | None = None  # what reproduces this row, where not the run's own command


def cell(text: object, limit: int = 400) -> str:
    """Text that fits one table cell: no pipe, no newline."""
    return " ".join(str(text).replace("|", "/").split())[:limit]


def row_cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


class Table:
    """RESULTS.md read as the lines before its table, its rows by id, and the lines after."""

    def __init__(self, path: Path = RESULTS) -> None:
        self.path = path
        lines = path.read_text(encoding="utf-8").splitlines()
        start = lines.index(HEADER)
        end = start + 2
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        self.head, self.tail = lines[:start], lines[end:]
        self.rows: dict[str, list[str]] = {}
        for line in lines[start + 2:end]:
            cells = row_cells(line)
            self.rows[cells[0].strip("`")] = cells

    def set(self, fig: Figure, date: str, machine: str, command: str, log: str) -> None:
        self.rows[fig.id] = [f"`{fig.id}`", cell(fig.what), cell(fig.target), cell(fig.value),
                             status_of(fig.status), date or "—", cell(machine) or "—",
                             f"`{cell(fig.command or command)}`",
                             f"[{Path(log).stem}]({log})" if log else "—"]

    def text(self) -> str:
        rows = ["| " + " | ".join(cells) + " |" for cells in self.rows.values()]
        return "\n".join([*self.head, HEADER, RULE, *rows, *self.tail]) + "\n"

    def save(self) -> None:
        write_atomic(self.path, self.text())


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def append_log(title: str, body: str, machine_line: str, command: str | None = None,
               logs: Path = LOGS, when: float | None = None) -> Path:
    """One dated section in logs/YYYY-MM-DD.md (the file made with its heading when new)."""
    stamp = time.gmtime(when)
    path = logs / f"{time.strftime('%Y-%m-%d', stamp)}.md"
    logs.mkdir(parents=True, exist_ok=True)
    head = "" if path.exists() else (
        f"# memtop benchmark log, {time.strftime('%Y-%m-%d', stamp)}\n\nEach section: what a "
        "case printed, its machine and command. RESULTS.md's table links here from the rows "
        "whose figure a section last changed.\n")
    lines = [f"\n## {title} ({time.strftime('%H:%M UTC', stamp)})", "", f"Machine: {machine_line}"]
    if command:
        lines += ["", f"Command: `{command}`"]
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(head + "\n".join(lines) + "\n\n" + body.strip() + "\n")
    return path


JUDGED = ("met", "missed", "inside noise")


def record(title: str, body: str, figures: Iterable[Figure], *, command: str,
           machine_line: str, machine_short: str, results: Path = RESULTS, logs: Path = LOGS,
           when: float | None = None) -> tuple[Path, list[str]]:
    """The dated section, then each figure's row in the table; returns the log's path and the
    ids of the rows written. A figure not judged (too few pairs, measured under load) leaves a
    row that holds a judged one as it was: the log has it."""
    log = append_log(title, body, machine_line, command, logs, when)
    figures, written = list(figures), []
    if figures:
        table = Table(results)
        date = time.strftime("%Y-%m-%d", time.gmtime(when))
        rel = os.path.relpath(log, results.parent)
        for fig in figures:
            held = table.rows.get(fig.id)
            if status_of(fig.status) == "not judged" and held and held[4] in JUDGED:
                continue
            table.set(fig, date, machine_short, command, rel)
            written.append(fig.id)
        table.save()
    return log, written


def publish(args: argparse.Namespace, title: str, body: str, figures: Iterable[Figure] = (),
            shown: str | None = None) -> None:
    """A case's last words: the machine and its figures (``shown``, else the whole section) on
    stdout; unless --no-append, the dated section and the figures' rows (``record``)."""
    from benchmarks.harness.machine import describe

    machine = describe()
    figures = list(figures)
    print(machine.line())
    print(body if shown is None else shown)
    for fig in figures:
        print(f"{fig.id}: {fig.value} (target {fig.target}: {status_of(fig.status)})")
    if not getattr(args, "no_append", True):
        log, written = record(title, body, figures, command=args.command,
                              machine_line=machine.line(), machine_short=machine.short())
        kept = [f.id for f in figures if f.id not in written]
        print(f"appended to {log}; rows of {RESULTS.name} written: {', '.join(written) or 'none'}"
              + (f"; kept (this run's figure not judged): {', '.join(kept)}" if kept else ""))
