"""`memtop sweep` as a process: a real two-cell sweep interrupted with Ctrl-C (the fit, the cells'
classification, the files and the refusals: tests/unit/test_sweep.py)."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest
from factories import SWEEP_ARGS, start_cli, wait_until

from probes.analysis.sweep import INTERRUPTED, OK


def _started(proc, out, cells: str):
    """A wait_until condition: the metrics file of a cell matching ``cells`` once its
    run_started row is written (the sweep still running)."""
    def started():
        assert proc.poll() is None, proc.stdout.read()
        found = list(out.glob(f"*/cells/{cells}/*/metrics.jsonl"))
        return found[0] if found and "run_started" in found[0].read_text() else None
    return started


@pytest.mark.slow
def test_real_sweep_interrupted_keeps_finished_cells(tmp_path):
    """Two tiny cells; Ctrl-C while the second runs: the first is kept with its figures, the
    second is "interrupted" in every file, and the exit status says interrupted."""
    out = tmp_path / "sweeps"
    proc = start_cli("sweep", *SWEEP_ARGS, "--batch-size", "2", "--seq-len", "8,16", "--steps",
                     "200", "--out", str(out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                     text=True)
    try:  # the second cell's run_started row is written: 202 steps still to go
        second = wait_until(_started(proc, out, "b2-t16-*"), "the second cell to start",
                            timeout_s=240, poll_s=0.2)
        proc.send_signal(signal.SIGINT)
        text, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, text
    data = json.loads(next(out.glob("*/sweep.json")).read_text())
    first, rest = data["cells"][0], data["cells"][1]
    assert first["status"] == OK and first["measured_steps"] == 200
    assert first["peak_allocated_bytes"] > 0 and first["tokens_per_s_p50"] > 0
    assert rest["status"] == INTERRUPTED and "partial run folder is kept" in rest["reason"]
    assert data["not_run"] == [] and data["interrupted"] is True
    assert second.parent.is_dir()  # the partial cell's run folder is kept
    assert f"interrupted while running {rest['cell']}; 0 cell(s) not run" in text


@pytest.mark.slow
def test_a_lost_terminal_ends_the_sweep_with_its_files(tmp_path):
    """SIGHUP (a killed tmux pane) killed the sweep before it wrote sweep.json and left the
    cell in flight training on its own: now it ends as for Ctrl-C, exit 129, the cell's
    child stopped."""
    out = tmp_path / "sweeps"
    proc = start_cli("sweep", *SWEEP_ARGS, "--batch-size", "2", "--seq-len", "8,16", "--steps",
                     "100000", "--out", str(out), stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True)
    try:
        cell = wait_until(_started(proc, out, "*"), "the first cell to start", timeout_s=240,
                          poll_s=0.2)
        proc.send_signal(signal.SIGHUP)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 129
    data = json.loads(next(out.glob("*/sweep.json")).read_text())
    assert data["interrupted"] is True and len(data["not_run"]) == 1
    assert data["cells"][0]["status"] == INTERRUPTED  # the cell in flight
    rows = [json.loads(line) for line in cell.read_text().splitlines()]
    assert rows[-1]["event"] == "run_finished"  # the child was stopped, not left running
