"""What every run does at its end, headless or not: write the report, say where the files are."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TextIO


def finish_run(run_dir: Path, out: TextIO | None) -> Path | None:
    """Write report.md/report.json; a failure here never loses the metrics already written."""
    from probes.report import write_report

    try:
        path = write_report(run_dir)
    except Exception as exc:  # the run's data is on disk already; say what went wrong
        if out is not None:
            with contextlib.suppress(OSError):
                print(f"memtop: could not write the report: {exc}", file=out, flush=True)
        return None
    if out is not None:
        with contextlib.suppress(OSError):  # a closed pipe must not hide that the report exists
            print(f"memtop: report {path}", file=out, flush=True)
    return path
