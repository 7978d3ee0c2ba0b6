"""Shared fixtures: tiny configs so the suite stays fast on two cores, apps whose trainers are
always joined, one finished run for the tests that only read it.

tests/unit/ runs in the test process (threads, files, Textual's Pilot); tests/integration/
starts processes (`python -m tui.cli`, torchrun, a pty) or soaks. `-m "not slow"` leaves out
the tests of more than ~5 s each. What the tests build and read (samples, run folders, sinks,
processes, waits) is tests/factories.py.
"""

from __future__ import annotations

import io
import os
import sys

import pytest
from factories import ONE_THREAD, QUIET_LOGS, ROOT, TINY

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

for _name, _value in {**QUIET_LOGS, **ONE_THREAD}.items():  # before any test imports torch
    os.environ.setdefault(_name, _value)


@pytest.fixture(autouse=True)
def heap_read_every_step(monkeypatch):
    """The heap is read every step in the suite's own processes, as on a healthy heap: a
    worker that has run hundreds of tests fragments its own heap until one mallinfo2 walk is
    over the read's budget (probes/counters/memory.py), and the leak tests' step counts would
    then depend on which tests ran before in that worker (CI saw a leak alert miss its 24
    steps). The spreading itself is tested with its own floor (test_probes.py,
    test_leak_trainer.py); processes a test starts run the real rule."""
    from probes.counters import memory

    monkeypatch.setattr(memory, "HEAP_READ_FLOOR_S", float("inf"))


@pytest.fixture
def tiny_config(tmp_path):
    """A factory for a TrainConfig small enough for ~5 ms steps, writing runs under tmp_path."""
    from trainer.config import TrainConfig

    def make(**overrides):
        values = dict(TINY, run_dir=str(tmp_path / "runs"))
        values.update(overrides)
        return TrainConfig(**values)

    return make


@pytest.fixture
def headless_trainer(tiny_config):
    """Start real trainer threads writing run folders and listening on their sockets, as a
    headless `memtop train` in another terminal would; each is stopped and joined after."""
    from probes.monitor import default_hooks
    from probes.runfolder import create_run_dir
    from trainer.loop import Trainer

    started: list = []

    def start(**overrides):
        cfg = tiny_config(**{"steps": 0, **overrides})
        trainer = Trainer(cfg, create_run_dir(cfg.run_dir),
                          hooks=default_hooks(**cfg.hook_options()))
        trainer.start()
        started.append(trainer)
        return trainer

    yield start
    for trainer in started:
        trainer.control.stop()
        trainer.join(120)


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


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """One real headless run of 12 tiny steps (finish_run writes its report), made once per
    worker for the tests that read it; a test that changes files works on a copy."""
    from probes.runfolder import create_run_dir
    from trainer.config import TrainConfig
    from tui.headless import run_headless

    root = tmp_path_factory.mktemp("runs")
    config = TrainConfig(**dict(TINY, steps=12, run_dir=str(root)))
    run_dir = create_run_dir(root)
    out = io.StringIO()
    assert run_headless(config, run_dir, log_every=100, out=out) == 0
    assert "memtop: report" in out.getvalue()
    return run_dir
