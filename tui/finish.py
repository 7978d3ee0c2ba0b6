"""What every run does at its end, headless or not: write the report, say where the files are."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TextIO


def finish_run(run_dir: Path, out: TextIO | None) -> Path | None:
    """Write report.md/report.json; a failure here never loses the metrics already written."""
    from probes.analysis.report.build import write_report

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
            for line in baseline_summary(path.with_name("report.json")):
                print(line, file=out, flush=True)
    return path


def baseline_summary(report_json: Path) -> list[str]:
    """With --baseline: the speed and peak verdicts, one line each (the report has the rest)."""
    import json

    from probes.records.names import peak_name

    try:
        report = json.loads(report_json.read_text(encoding="utf-8"))
        section = report.get("baseline")
        device = str((report.get("results") or {}).get("device") or "cpu")
    except (OSError, ValueError, AttributeError):
        return []
    if not isinstance(section, dict):
        return []
    if section.get("error"):
        return [f"memtop: baseline not compared: {section['error']}"]
    c = section.get("comparison") or {}
    peak = ((c.get("peaks") or {}).get("peak_allocated_bytes") or {}).get("ratio")
    lines = [f"memtop: vs baseline {Path(str(section.get('run'))).name}: tokens/s "
             f"{c.get('tokens_per_s_verdict')}"]
    if peak is not None:
        lines.append(f"memtop: vs baseline: {peak_name('allocated', device)} "
                     f"{(peak - 1) * 100:+.1f}%")
    return lines
