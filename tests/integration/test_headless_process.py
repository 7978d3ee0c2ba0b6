"""A headless `memtop train` process: a signal mid-run keeps every row and sets the exit status,
an unusable current directory and a diverging run say so (faults inside a trainer of this
process: tests/unit/test_reliability.py)."""

from __future__ import annotations

import signal
import subprocess
import threading

import pytest
from factories import (
    METRICS,
    TINY_ARGS,
    read_jsonl,
    read_jsonl_so_far,
    run_cli,
    start_cli,
    wait_until,
)


def _start_headless(tmp_path, *extra, **popen):
    return start_cli("train", "--headless", "--steps", "0", "--log-every", "1", "--run-dir",
                     str(tmp_path), *TINY_ARGS, *extra, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True, **popen)


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


def _check_interrupted_run(tmp_path, signame, reason=None):
    (run,) = tmp_path.iterdir()
    rows = read_jsonl(run / METRICS)  # every line is complete, valid JSON
    steps = [r["step"] for r in rows if "event" not in r]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 5
    assert rows[-1]["event"] == "run_finished"
    assert rows[-1]["reason"] == (reason or f"interrupted ({signame})")
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


@pytest.mark.slow
def test_a_lost_terminal_ends_a_headless_run_cleanly_unless_nohup(tmp_path):
    """A killed tmux pane or a dropped SSH session sends SIGHUP: the run ended with no
    run_finished and no report (the signal's default). Now it stops at its step boundary as
    for SIGTERM, exit 129; started under nohup (SIGHUP ignored) it runs on."""
    proc = _start_headless(tmp_path / "tty")
    _wait_for_steps(proc, 5)
    proc.send_signal(signal.SIGHUP)
    proc.wait(timeout=60)
    err = proc.stderr.read()
    assert proc.returncode == 129 and "Traceback" not in err, err
    run = _check_interrupted_run(tmp_path / "tty", "SIGHUP", "interrupted (terminal lost)")
    assert (run / "report.md").is_file()

    nohup = _start_headless(tmp_path / "nohup",
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    _wait_for_steps(nohup, 3)
    nohup.send_signal(signal.SIGHUP)
    (run,) = (tmp_path / "nohup").iterdir()
    rows_then = len(read_jsonl_so_far(run / METRICS))
    wait_until(lambda: len(read_jsonl_so_far(run / METRICS)) >= rows_then + 3,
               "rows after the hangup")  # still training
    assert nohup.poll() is None
    nohup.send_signal(signal.SIGTERM)
    nohup.wait(timeout=60)
    assert nohup.returncode == 143
    _check_interrupted_run(tmp_path / "nohup", "SIGTERM")


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
