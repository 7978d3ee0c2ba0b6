"""The run folder read back: a follower over a file another process writes (torn last line,
junk lines, deletion), the fast history of a finished run, and `memtop runs`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import run_cli

from probes import records as R
from probes.analysis.runlist import summarize_run
from probes.records import Event, StepSample
from probes.runfolder import (
    METRICS,
    Follower,
    RunFolderError,
    check_run_folder,
    json_line,
    read_history,
    resolve_run,
    write_json,
)
from probes.runfolder.state import RunState

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


def _sample(step: int, **kw) -> StepSample:
    values = dict(step=step, time_s=step * 0.1, loss=2.0, tokens_per_s=1000.0, step_ms=10.0,
                  allocated_bytes=100, reserved_bytes=200, peak_allocated_bytes=150,
                  driver_used_bytes=None, host_rss_bytes=300, scale=None, skipped_steps=0,
                  amp="bf16", device="cpu", grad_norm=1.0, profiling=False, leak_active=False)
    values.update(kw)
    return StepSample(**values)


def _line(record) -> bytes:
    return json_line(record.to_json()).encode() + b"\n"


def _started(**data) -> Event:
    return Event(R.RUN_STARTED, 0, 0.0, {"device": "cpu", "amp": "bf16", "params": 10, **data})


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
        whole = _line(_sample(1))
        write(_line(_started()) + whole[:25])  # the second row is torn mid-way
        rows = follower.poll()
        assert [r.get("event") for r in rows] == ["run_started"]
        assert follower.waiting_for_newline and follower.bad == 0
        write(whole[25:] + b"{not json\n" + _line(_sample(2)))
        rows = follower.poll()
        assert [r["step"] for r in rows] == [1, 2]  # the torn row, whole, then the next
        assert StepSample.from_json(rows[0]) == _sample(1)
        assert follower.bad == 1 and not follower.waiting_for_newline
        os.unlink(path)
        assert follower.poll() == [] and follower.gone
    finally:
        writer.stdin.close()
        writer.wait(timeout=30)


def test_history_of_a_long_run_keeps_events_tail_and_a_thinned_chart(tmp_path):
    path = tmp_path / METRICS
    with open(path, "wb") as fh:
        fh.write(_line(_started()))
        for step in range(1, 5001):
            fh.write(_line(_sample(step)))
            if step == 4995:
                fh.write(b"junk\n")  # within the tail: parsed, counted, skipped
            if step == 2500:
                fh.write(_line(Event(R.LEAK_SUSPECTED, step, 1.0, {"counter": "host_heap"})))
        fh.write(_line(Event(R.RUN_FINISHED, 5000, 500.0, {"reason": "finished"})))
        fh.write(_line(_sample(5001))[:30])  # a torn tail is left for the follower
    hist = read_history(path, keep_last=10, chart_points=100)
    events = [r["event"] for r in hist.rows if "event" in r]
    assert events == ["run_started", "leak_suspected", "run_finished"]
    # the tail's 10 lines, one of them junk
    assert [r["step"] for r in hist.rows if "event" not in r] == list(range(4992, 5001))
    assert 90 <= len(hist.chart_steps) <= 110 and hist.chart_steps[0]["step"] == 1
    assert hist.steps_total == 5001 and hist.bad == 1  # non-event lines, the junk one included
    assert hist.end == path.stat().st_size - 30
    state = RunState()
    for row in hist.rows:
        state.apply(R.record_from_json(row))
    assert state.finished and state.step == 5000 and state.outcome == "finished"
    assert "host_heap" in state.alerts


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
    (folder / METRICS).write_bytes(b"".join(_line(r) for r in rows))
    return folder


def test_runs_lists_each_state(tmp_path):
    root = tmp_path / "runs"
    done = [_started(), _sample(1), _sample(2, tokens_per_s=2048.0, peak_allocated_bytes=3 << 20),
            Event(R.RUN_FINISHED, 2, 1.0, {"reason": "finished"})]
    _run(root, "20260101-000000-aaaaaa", done)
    failed = [_started(), _sample(1), Event(R.ERROR, 2, 1.0, {"error_type": "NonFiniteError",
                                                              "message": "loss became nan"}),
              Event(R.RUN_FINISHED, 2, 1.0, {"reason": "failed"})]
    _run(root, "20260101-000001-bbbbbb", failed)
    _run(root, "20260101-000002-cccccc", [_started(), _sample(1)])  # killed: no run_finished
    (root / "not-a-run").mkdir()
    assert summarize_run(root / "20260101-000002-cccccc").outcome == "interrupted"
    result = run_cli("runs", str(root))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["RUN", "STATE", "STEPS"]
    assert [ln.split()[:3] for ln in lines[1:]] == [
        ["20260101-000000-aaaaaa", "finished", "2"], ["20260101-000001-bbbbbb", "failed", "1"],
        ["20260101-000002-cccccc", "interrupted", "1"]]
    assert "2.0k tok/s" in lines[1] and "3.0 MiB" in lines[1]
    assert "NonFiniteError: loss became nan" in lines[2]
    assert run_cli("runs", str(tmp_path / "empty-root-missing")).returncode == 2
    (tmp_path / "none").mkdir()
    assert "no runs in" in run_cli("runs", str(tmp_path / "none")).stdout


def test_config_json_loads_without_resolving_the_device(tmp_path):
    """A CUDA run's config reads on a CPU-only machine: the device resolves only at run start."""
    from trainer.config import TrainConfig

    cfg = TrainConfig(device="cuda:1", amp="fp16", run_dir=str(tmp_path))
    back = TrainConfig.from_json(json.loads(json.dumps(cfg.to_json())))
    assert back.device == "cuda:1" and back.amp == "fp16"
