"""The experiment report (docs/ARCHITECTURE.md, the method): report.json + report.md, built
from a run folder's files by its sections (probes/analysis/report/sections/), in their order.

Only files are read (config.json, metrics.jsonl), never torch, so it runs from any thread and on
a machine other than the one that trained. A killed run still gets a report from the rows that
exist, marked incomplete; a folder that is not a run raises ReportError and nothing is written.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from probes.analysis.report.context import ReportError, load_context
from probes.analysis.report.sections import SECTIONS, Section
from probes.runfolder import REPORT_JSON, REPORT_MD, write_json, write_text

# One writer at a time: `r` twice, `r` then `q`, or the quit thread and shutdown() after a forced
# quit would otherwise build and replace report.json/report.md from two threads at once.
_WRITE_LOCK = threading.Lock()

Built = list[tuple[Section, dict[str, Any]]]  # each section present, with what it built


def _build(run_dir: Path) -> Built:
    ctx = load_context(run_dir)
    sections = SECTIONS[ctx.mode]
    built: dict[int, dict[str, Any]] = {}
    for i in sorted(range(len(sections)), key=lambda i: sections[i].summary):
        part = sections[i].build(ctx)
        if part is not None:
            built[i] = part
            ctx.built.update(part)
    return [(s, built[i]) for i, s in enumerate(sections) if i in built]


def _guarded_build(run_dir: str | os.PathLike[str]) -> Built:
    """Any exception but ReportError means input this reader did not foresee: it becomes a
    ReportError too, so `memtop report` says so in one line (exit 2) instead of a crash."""
    try:
        return _build(Path(run_dir))
    except ReportError:
        raise
    except Exception as exc:
        raise ReportError(f"{run_dir}: unexpected content in the run's files "
                          f"({type(exc).__name__}: {exc})") from None


def _merged(built: Built) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for _, part in built:
        report.update(part)
    return report


def build_report(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Everything report.md shows, as plain JSON-able data. ReportError if not a run folder."""
    return _merged(_guarded_build(run_dir))


def write_report(run_dir: str | os.PathLike[str]) -> Path:
    """Write report.json and report.md (atomically) into the run folder; returns report.md.

    Serialised by a lock, so writers on several threads replace the files one after the other.
    """
    run_dir = Path(run_dir)
    with _WRITE_LOCK:
        built = _guarded_build(run_dir)
        report = _merged(built)
        try:
            lines = [line for section, part in built for line in section.render(part, report)]
        except Exception as exc:  # a rendering gap for data the sections let through
            raise ReportError(f"{run_dir}: cannot render the report "
                              f"({type(exc).__name__}: {exc})") from None
        md = run_dir / REPORT_MD
        try:
            write_json(run_dir / REPORT_JSON, report)
            write_text(md, "\n".join(lines))
        except OSError as exc:
            raise ReportError(f"cannot write the report into {run_dir}: "
                              f"{exc.strerror or exc}") from None
        except (ValueError, RecursionError) as exc:  # e.g. a deeply nested recorded value
            raise ReportError(f"{run_dir}: cannot serialise the report "
                              f"({type(exc).__name__}: {exc})") from None
    return md
