"""`memtop train` as a process: the real dashboard on a pseudo-terminal, killed; without a
terminal; and its first frame, drawn before torch is imported.

(SIGHUP with the terminal really gone, in every state: tests/integration/test_terminal_loss.py.)
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from factories import (
    METRICS,
    TINY_ARGS,
    read_jsonl,
    run_cli,
    run_python,
    start_cli,
    subprocess_env,
)

from tui.panes import PANES


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM])
def test_signal_quits_cleanly_and_gives_the_terminal_back(tmp_path, sig):
    """The real dashboard on a pseudo-terminal, killed: run_finished, report, cooked terminal."""
    import fcntl
    import select
    import struct
    import termios

    try:
        master, slave = os.openpty()
    except OSError as exc:
        pytest.skip(f"no pseudo-terminal here: {exc}")
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    cooked = termios.tcgetattr(slave)[3] & (termios.ICANON | termios.ECHO | termios.ISIG)
    root = tmp_path / "runs"
    proc = start_cli("train", *TINY_ARGS, "--steps", "0", "--run-dir", str(root),
                     env=subprocess_env(TERM="xterm-256color"), stdin=slave, stdout=slave,
                     stderr=slave, start_new_session=True)
    shown = bytearray()

    def drain(timeout: float) -> None:  # read what the app draws so the pty never fills up
        if select.select([master], [], [], timeout)[0]:
            try:
                shown.extend(os.read(master, 1 << 16))
            except OSError:
                pass

    def steps_written() -> int:
        found = list(root.glob(f"*/{METRICS}"))
        return found[0].read_text().count('"loss"') if found else 0

    try:
        deadline = time.monotonic() + 90
        while steps_written() < 3 and proc.poll() is None and time.monotonic() < deadline:
            drain(0.1)
        assert proc.poll() is None and steps_written() >= 3, bytes(shown[-2000:])
        raw = termios.tcgetattr(slave)[3] & (termios.ICANON | termios.ECHO | termios.ISIG)
        assert raw != cooked  # the app really had the terminal in raw mode
        proc.send_signal(sig)
        deadline = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline:
            drain(0.1)
        drain(0.2)
        assert proc.poll() == 128 + sig, bytes(shown[-2000:])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        after = termios.tcgetattr(slave)[3] & (termios.ICANON | termios.ECHO | termios.ISIG)
        os.close(master)
        os.close(slave)
    run_dir = next(root.iterdir())
    last = read_jsonl(run_dir / METRICS)[-1]
    assert last["event"] == "run_finished"
    assert last["reason"] == f"interrupted ({signal.Signals(sig).name})"
    assert (run_dir / "report.md").is_file()
    assert after == cooked  # echo and line editing are back
    assert f"memtop: run folder {run_dir}".encode() in shown


def test_no_terminal_says_so_and_exits_2(tmp_path):
    """Without a TTY the dashboard points at --headless in one line, and creates nothing."""
    result = run_cli("train", "--run-dir", str(tmp_path / "runs"), timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--headless" in lines[0] and "TTY" in lines[0]
    assert result.stderr.count("\n") == 1
    assert not list(tmp_path.iterdir())  # nothing was created


DEFERRED_FRAME = r"""
import asyncio, sys
from pathlib import Path
from probes.runfolder import create_run_dir
from trainer.config import TrainConfig
from tui.app import MemtopApp

async def main():
    config = TrainConfig(device="cpu", steps=0, run_dir=sys.argv[1])
    app = MemtopApp.for_run(config, create_run_dir(sys.argv[1]), deferred=True, autostart=False,
                            freeze_gc=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        print("header:", app.header_bar.text.replace("\n", " "))
        print("panes:", len(app.panes), "torch imported:", "torch" in sys.modules)
    app.shutdown(10)

asyncio.run(main())
"""


def test_deferred_dashboard_frame_is_up_before_torch_is_imported(tmp_path):
    """`memtop train` draws header and panes, "starting", while torch is not yet imported:
    the trainer thread imports it (benchmarks/RESULTS.md: the frame within 0.6 s, RESULTS.md)."""
    res = run_python(DEFERRED_FRAME, str(tmp_path))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "STARTING" in res.stdout and "torch imported: False" in res.stdout, res.stdout
    assert f"panes: {len(PANES)} " in res.stdout, res.stdout  # every pane of the table
