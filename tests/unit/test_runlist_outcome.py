"""`memtop runs`' outcome word (issue 44 item 12): a paused live run is "paused", not "live";
a finished run whose report calls it incomplete (bad lines) is "incomplete", not "finished"."""

from __future__ import annotations

import json

from factories import write_run

from probes import records as R
from probes.analysis.report import write_report
from probes.analysis.runlist import summarize_run
from probes.control.requests import RunControl
from probes.control.unix_socket import ControlServer
from probes.records import Event
from probes.runfolder import json_line


def test_a_paused_live_run_is_listed_paused(tmp_path):
    run = write_run(tmp_path / "run")
    lines = (run / "metrics.jsonl").read_text().splitlines()[:-1]  # no run_finished: going on
    lines.append(json_line(Event(R.PAUSED, 60, 1.0, {}).to_json()))
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert summarize_run(run).outcome == "interrupted"  # nobody answers
    server = ControlServer(run / "control.sock", RunControl(),
                           lambda: {"pid": 1, "rank": None, "step": 60, "state": "paused"},
                           lambda req: None)
    assert server.start(), server.error
    try:
        assert summarize_run(run).outcome == "paused"
        (run / "metrics.jsonl").write_text(
            "\n".join([*lines, json_line(Event(R.RESUMED, 60, 2.0, {}).to_json())]) + "\n")
        assert summarize_run(run).outcome == "live"
    finally:
        server.close()


def test_a_finished_run_with_bad_lines_is_incomplete_as_its_report_says(tmp_path):
    run = write_run(tmp_path / "run")
    write_report(run)
    assert summarize_run(run, ping=False).outcome == "finished"
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[5:5] = ["{not json", json.dumps({"step": 3, "step_ms": -1.0})]  # two bad lines
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    md = write_report(run).read_text()
    assert "Incomplete run." in md and "2 bad line(s)" in md
    summary = summarize_run(run, ping=False)
    assert summary.outcome == "incomplete" and "2 bad line(s)" in (summary.reason or "")
