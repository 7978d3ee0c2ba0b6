"""`memtop report` as a process: a run killed with SIGKILL gets an incomplete report, and bad
input is one line on stderr and exit 2 with nothing touched (the report's content:
tests/unit/test_report.py, tests/unit/test_report_sections.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
from factories import (
    TINY_ARGS,
    copy_run,
    file_digest,
    run_cli,
    run_digests,
    start_cli,
    wait_until,
    write_junk_run,
)

from probes.analysis.report import ReportError, build_report
from probes.runfolder import read_metrics


def test_killed_run_gets_an_incomplete_report(tmp_path):
    """A real run killed with SIGKILL mid-way, then a half-written last line."""
    root = tmp_path / "runs"
    proc = start_cli("train", "--headless", *TINY_ARGS, "--steps", "0", "--run-dir", str(root),
                     "--log-every", "1000", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ledger_written():
        found = list(root.glob("*/metrics.jsonl"))
        return found[0] if found and '"event":"ledger"' in found[0].read_text() else None

    try:
        metrics = wait_until(ledger_written, "the run's ledger row", poll_s=0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    run_dir = metrics.parent
    report = build_report(run_dir)
    assert report["complete"] is False
    assert any("no run_finished row" in r for r in report["incomplete_reasons"])
    steps, _, torn = read_metrics(metrics)  # SIGKILL may land mid-line: that line is left out
    assert torn <= 1
    assert report["results"]["steps_recorded"] == len(steps) >= 3
    assert report["ledger"] is not None

    with open(metrics, "a", encoding="utf-8") as fh:
        fh.write('{"step": 99999, "time_s": 1.0, "lo')  # killed while writing this line
    before = run_digests(run_dir)
    result = run_cli("report", str(run_dir))
    assert result.returncode == 0, result.stderr
    report = json.loads((run_dir / "report.json").read_text())
    assert any("cut short" in r for r in report["incomplete_reasons"])
    assert report["results"]["steps_recorded"] == len(steps)
    assert "Incomplete run" in (run_dir / "report.md").read_text()
    assert "incomplete run" in result.stdout
    assert before == run_digests(run_dir)


@pytest.mark.parametrize("case", ["missing", "no_metrics", "junk_metrics", "empty_metrics",
                                  "config_not_json", "config_bad_field", "is_a_file"])
def test_report_on_bad_input_is_one_line_and_exit_2(finished_run, tmp_path, case):
    run_dir = tmp_path / "run"
    if case == "missing":
        pass
    elif case == "is_a_file":
        run_dir.write_text("not a folder")
    else:
        copy_run(finished_run, run_dir)
        if case == "no_metrics":
            (run_dir / "metrics.jsonl").unlink()
        elif case == "junk_metrics":
            (run_dir / "metrics.jsonl").write_bytes(os.urandom(4096) + b"\n[1, 2]\n{oops\n")
        elif case == "empty_metrics":
            (run_dir / "metrics.jsonl").write_bytes(b"")
        elif case == "config_not_json":
            (run_dir / "config.json").write_text("{ batch_size: 4")
        elif case == "config_bad_field":
            config = json.loads((run_dir / "config.json").read_text())
            config["seq_len"] = "sixteen"
            (run_dir / "config.json").write_text(json.dumps(config))
    before = {p.name: file_digest(p) for p in run_dir.iterdir()} if run_dir.is_dir() else None
    result = run_cli("report", str(run_dir), timeout=60)
    assert result.returncode == 2, (case, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memtop report: "), result.stderr
    assert "Traceback" not in result.stderr
    if before is not None:  # nothing written, nothing changed
        assert before == {p.name: file_digest(p) for p in run_dir.iterdir()}
    with pytest.raises(ReportError):
        build_report(run_dir)


def test_report_on_unforeseen_content_is_one_line_and_exit_2(tmp_path):
    """A params count too large for a float passes every type check and then overflows: the
    catch-all turns what would be a crash (exit 1) into one line and exit 2."""
    run_dir = write_junk_run(tmp_path, {"params": 10**400}, [])
    result = run_cli("report", str(run_dir), timeout=60)
    assert result.returncode in (0, 2), result.stderr  # 0 once such a value is checked too
    assert "Traceback" not in result.stderr
    if result.returncode == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("memtop report: "), result.stderr
        assert not (run_dir / "report.md").exists()
