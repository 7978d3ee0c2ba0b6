"""Shared fixtures: tiny configs so the suite stays fast on two cores."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
os.environ.setdefault("KINETO_LOG_LEVEL", "5")

TINY = dict(device="cpu", layers=1, heads=2, dim=32, seq_len=16, block_size=32, batch_size=4,
            warmup_steps=2)


@pytest.fixture
def tiny_config(tmp_path):
    """A factory for a TrainConfig small enough for ~5 ms steps, writing runs under tmp_path."""
    from trainer.config import TrainConfig

    def make(**overrides):
        values = dict(TINY, run_dir=str(tmp_path / "runs"))
        values.update(overrides)
        return TrainConfig(**values)

    return make


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 120,
            env: dict | None = None):
    """Run `python -m tui.cli ARGS` in a subprocess (real process, real exit code)."""
    import subprocess

    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    if env:
        full_env.update(env)
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout, env=full_env,
                          stdin=subprocess.DEVNULL)


def in_thread(fn, *args, **kwargs):
    """Run torch work off the main thread: a parallel torch op on the main thread slows every
    later background trainer in this process ~3× (docs/ARCHITECTURE.md), and the suite shares
    one process."""
    import threading

    box: dict = {}

    def target():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised on the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


# --- waiting on conditions, never on the clock -------------------------------------------------
DEADLINE_S = 90.0  # an upper bound for a busy 2-core machine, never a duration to wait out


def wait_until(condition, what: str, timeout_s: float = DEADLINE_S, poll_s: float = 0.01):
    """Block until ``condition()`` is true (returns its value); AssertionError naming ``what``
    after ``timeout_s``. For threads and processes; ``wait_for`` below is the Pilot's."""
    import time

    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll_s)
    return value


# --- the dashboard under Pilot ---------------------------------------------------------------


async def wait_for(pilot, condition, what: str, step_s: float = 0.1) -> None:
    """Let the app run until ``condition()`` holds; fail with ``what`` after a long deadline."""
    waited = 0.0
    while not condition():
        if waited > DEADLINE_S:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(step_s)
        waited += step_s


@pytest.fixture
def make_app(tiny_config, tmp_path):
    """Build apps over tiny trainers; whatever a test does, every trainer thread is joined."""
    from probes.runfolder import create_run_dir
    from tui.app import MemtopApp

    apps: list = []

    def make(**kw):
        config = tiny_config(steps=kw.pop("steps", 0))
        run_dir = create_run_dir(tmp_path / "runs")
        hooks = kw.pop("extra_hooks", [])
        app = MemtopApp.for_run(config, run_dir, refresh_s=0.1, freeze_gc=False, **kw)
        app.trainer.hooks.extend(hooks)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.shutdown(timeout_s=60)
        assert not app.trainer.alive


