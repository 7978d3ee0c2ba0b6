"""``memtop report RUN_DIR``: (re)write report.md and report.json for a run folder.

Bad input (missing folder, no metrics.jsonl, junk, malformed config.json, content the reader
did not foresee) is one line on stderr and exit status 2; values of the wrong type inside rows are
shown as n/a. Nothing the run recorded is ever touched, only the derived report files.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import textwrap

from tui.commands.argtypes import EXIT_USAGE


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write report.md and report.json for a run folder",
                       description="Write report.md and report.json for a finished (or "
                                   "interrupted) run folder.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a runs/<timestamp>-<id>/ folder")


def run(args: argparse.Namespace) -> int:
    """Write the report; print where it is, its finding (what a user over SSH reads first,
    without opening the file) and why it is incomplete when it is."""
    from probes.analysis.report import ReportError, write_report

    try:
        path = write_report(args.run_dir)
    except ReportError as exc:
        print(f"memtop report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # a bug in memtop itself: still no traceback, files untouched
        print(f"memtop report: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"memtop: report {path} (data: {path.with_name('report.json').name})")
    try:
        report = json.loads(path.with_name("report.json").read_text(encoding="utf-8"))
        finding = report.get("finding")
        if isinstance(finding, str) and finding:
            width = max(40, min(shutil.get_terminal_size((80, 24)).columns, 100))
            print(textwrap.fill(finding, width=width, initial_indent="  ",
                                subsequent_indent="  "))
        if not report.get("complete", True):
            print("memtop: incomplete run: " + "; ".join(report["incomplete_reasons"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return 0
