"""A headless `memtop train` process: a signal mid-run keeps every row and sets the exit status,
an unusable current directory and a diverging run say so (faults inside a trainer of this
process: tests/unit/test_reliability.py)."""

from __future__ import annotations

import signal
import subprocess
import threading

import pytest
from factories import METRICS, TINY_ARGS, read_jsonl, run_cli, start_cli


def _start_headless(tmp_path, *extra):
    return start_cli("train", "--headless", "--steps", "0", "--log-every", "1", "--run-dir",
                     str(tmp_path), *TINY_ARGS, *extra, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True)


def _wait_for_steps(proc, n, timeout=90):
    """Read the child's lines on a thread, so a stuck child fails the test instead of hanging."""
    reached = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            if line.startswith("step") and int(line.split()[1]) >= n:
                reached.set()
        reached.set()  # EOF: let the caller look at the exit status

    threading.Thread(target=read, daemon=True).start()
    if not reached.wait(timeout) or proc.poll() is not None:
        proc.kill()
        raise AssertionError("the headless run did not reach the step in time")


def _check_interrupted_run(tmp_path, signame):
    (run,) = tmp_path.iterdir()
    rows = read_jsonl(run / METRICS)  # every line is complete, valid JSON
    steps = [r["step"] for r in rows if "event" not in r]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 5
    assert rows[-1]["event"] == "run_finished"
    assert rows[-1]["reason"] == f"interrupted ({signame})"
    return run


@pytest.mark.slow
def test_sigint_mid_run_keeps_every_row_and_exits_130(tmp_path):
    proc = _start_headless(tmp_path)
    _wait_for_steps(proc, 5)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    err = proc.stderr.read()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    _check_interrupted_run(tmp_path, "SIGINT")


@pytest.mark.slow
def test_sigterm_mid_run_exits_143(tmp_path):
    proc = _start_headless(tmp_path)
    _wait_for_steps(proc, 5)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode == 143
    _check_interrupted_run(tmp_path, "SIGTERM")


def test_unwritable_current_directory_is_a_clear_error():
    result = run_cli("train", "--headless", "--steps", "1", cwd="/proc")
    assert result.returncode == 2
    assert "pass --run-dir" in result.stderr and "Traceback" not in result.stderr


def test_a_failing_headless_run_exits_non_zero(tmp_path):
    # seq-len 16 with a dim that trains, but lr = 1e30 makes the weights overflow without AMP
    result = run_cli("train", "--headless", "--steps", "30", "--amp", "off", "--lr", "1e30",
                     "--run-dir", str(tmp_path), *TINY_ARGS)
    assert result.returncode == 1, result.stdout[-2000:]
    assert "NonFiniteError" in result.stdout
