"""The run folder read back from outside: a follower over a file another process writes (torn
last line, junk lines, deletion), `memtop runs` over each state of a run, and the refusals of
`memtop view` and `memtop runs` (a finished run's history and its config:
tests/unit/test_run_history.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from factories import make_sample, record_line, run_cli, started_event

from probes import records as R
from probes.analysis.runlist import summarize_run
from probes.records import Event, StepSample
from probes.runfolder import (
    METRICS,
    Follower,
    RunFolderError,
    check_run_folder,
    resolve_run,
    write_json,
)

# A writer in another process: each stdin line is hex bytes to append (flushed at once); it
# answers "ok" so the test knows the bytes are on disk before it polls.
WRITER = r"""
import sys
path = sys.argv[1]
with open(path, "ab", buffering=0) as fh:
    for line in sys.stdin:
        fh.write(bytes.fromhex(line.strip()))
        print("ok", flush=True)
"""


def test_follower_waits_for_a_torn_line_and_counts_junk(tmp_path):
    path = tmp_path / METRICS
    path.touch()
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)

    def write(data: bytes) -> None:
        writer.stdin.write(data.hex() + "\n")
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == "ok"

    try:
        follower = Follower(path)
        assert follower.poll() == []
        whole = record_line(make_sample(1))
        write(record_line(started_event()) + whole[:25])  # the second row is torn mid-way
        rows = follower.poll()
        assert [r.get("event") for r in rows] == ["run_started"]
        assert follower.waiting_for_newline and follower.bad == 0
        write(whole[25:] + b"{not json\n" + record_line(make_sample(2)))
        rows = follower.poll()
        assert [r["step"] for r in rows] == [1, 2]  # the torn row, whole, then the next
        assert StepSample.from_json(rows[0]) == make_sample(1)
        assert follower.bad == 1 and not follower.waiting_for_newline
        os.unlink(path)
        assert follower.poll() == [] and follower.gone
    finally:
        writer.stdin.close()
        writer.wait(timeout=30)


def test_refusals_missing_folder_and_not_a_run_folder(tmp_path):
    with pytest.raises(RunFolderError, match="does not exist"):
        check_run_folder(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunFolderError, match="not a memtop run folder"):
        check_run_folder(tmp_path / "empty")
    with pytest.raises(RunFolderError, match="neither a memtop run folder"):
        resolve_run(tmp_path / "empty")
    for args in (["view", str(tmp_path / "nope")], ["view", str(tmp_path / "empty")],
                 ["runs", str(tmp_path / "nope")]):
        result = run_cli(*args)
        assert result.returncode == 2, result
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
        assert result.stderr.startswith(f"memtop {args[0]}: ")


def _run(root, name, rows, config=True):
    folder = root / name
    folder.mkdir(parents=True)
    if config:
        write_json(folder / "config.json", {"steps": 0})
    (folder / METRICS).write_bytes(b"".join(record_line(r) for r in rows))
    return folder


def test_runs_lists_each_state(tmp_path):
    root = tmp_path / "runs"
    # throughput: the median of the measured steps (2.0k), not the last step's (3.5k)
    done = [started_event(), make_sample(1), make_sample(2, tokens_per_s=2048.0),
            make_sample(3, tokens_per_s=3500.0, peak_allocated_bytes=3 << 20),
            Event(R.RUN_FINISHED, 3, 1.0, {"reason": "finished"})]
    _run(root, "20260101-000000-aaaaaa", done)
    failed = [started_event(), make_sample(1),
              Event(R.ERROR, 2, 1.0, {"error_type": "NonFiniteError",
                                      "message": "loss became nan"}),
              Event(R.RUN_FINISHED, 2, 1.0, {"reason": "failed"})]
    _run(root, "20260101-000001-bbbbbb", failed)
    # killed: no run_finished
    _run(root, "20260101-000002-cccccc", [started_event(), make_sample(1)])
    (root / "not-a-run").mkdir()
    assert summarize_run(root / "20260101-000002-cccccc").outcome == "interrupted"
    result = run_cli("runs", str(root))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["RUN", "STATE", "STEPS"]
    assert [ln.split()[:3] for ln in lines[1:]] == [
        ["20260101-000000-aaaaaa", "finished", "3"], ["20260101-000001-bbbbbb", "failed", "1"],
        ["20260101-000002-cccccc", "interrupted", "1"]]
    assert "2.0k tok/s" in lines[1] and "3.0 MiB" in lines[1]
    assert all(len(ln) <= 80 for ln in lines[:2]), lines  # a run id's line fits 80 columns
    assert "NonFiniteError: loss became nan" in lines[2]
    assert run_cli("runs", str(tmp_path / "empty-root-missing")).returncode == 2
    (tmp_path / "none").mkdir()
    assert "no runs in" in run_cli("runs", str(tmp_path / "none")).stdout
