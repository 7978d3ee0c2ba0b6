"""``memtop report RUN_DIR``: (re)write report.md and report.json for a run folder.

Bad input (missing folder, no metrics.jsonl, junk, malformed config.json, content the reader
did not foresee) is one line on stderr and exit status 2; values of the wrong type inside rows are
shown as n/a. Nothing the run recorded is ever touched, only the derived report files.
"""

from __future__ import annotations

import json
import sys

EXIT_USAGE = 2


def run_report(run_dir: str) -> int:
    """Write the report; print where it is, and why it is incomplete when it is."""
    from probes.report import ReportError, write_report

    try:
        path = write_report(run_dir)
    except ReportError as exc:
        print(f"memtop report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # a bug in memtop itself: still no traceback, files untouched
        print(f"memtop report: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"memtop: report {path} (data: {path.with_name('report.json').name})")
    try:
        report = json.loads(path.with_name("report.json").read_text(encoding="utf-8"))
        if not report.get("complete", True):
            print("memtop: incomplete run: " + "; ".join(report["incomplete_reasons"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return 0
