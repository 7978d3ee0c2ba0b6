"""The `memtop` process: a headless run end to end, --version and --help as a terminal shows
them (bad input in this process: tests/unit/test_cli.py)."""

from __future__ import annotations

import json

from factories import TINY_ARGS, metrics_rows, run_cli

from probes.counters.host import cpu_bf16_override, read_cpu_flags
from trainer.config import auto_amp


def test_headless_subprocess_end_to_end(tmp_path):
    result = run_cli("train", "--headless", "--steps", "12", "--log-every", "4",
                     "--run-dir", str(tmp_path), *TINY_ARGS)
    assert result.returncode == 0, result.stderr
    assert "step     12" in result.stdout and "run_finished" in result.stdout
    (run,) = tmp_path.iterdir()
    steps, events = metrics_rows(run)
    assert len(steps) == 12
    config = json.loads((run / "config.json").read_text())
    assert config["device"] == "cpu" and config["amp"] == "auto"  # as given
    # and as run: bf16 where this CPU has it natively (or MEMTOP_CPU_BF16 says so), else fp32
    flags, override = read_cpu_flags(), cpu_bf16_override()
    amp, why = auto_amp("cpu", flags, override)
    assert config["resolved_device"] == "cpu" and config["resolved_amp"] == amp
    started = next(e for e in events if e["event"] == "run_started")
    assert started["device"] == "cpu" and started["amp"] == amp  # as resolved at run start
    assert started["amp_reason"] == why and started["cpu_bf16_override"] == override
    assert ("MEMTOP_CPU_BF16" in why) == (override is not None)


def test_version_and_help_fit_80_columns():
    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout.startswith("memtop ")
    for args in (("--help",), ("train", "--help"), ("report", "--help")):
        out = run_cli(*args, env={"COLUMNS": "200"}).stdout
        assert out and max(len(line) for line in out.splitlines()) <= 80, args


def test_help_explains_every_option():
    result = run_cli("train", "--help")
    assert result.returncode == 0
    for flag in ("--device", "--amp", "--batch-size", "--seq-len", "--layers", "--heads", "--dim",
                 "--steps", "--lr", "--seed", "--warmup-steps", "--attention", "--run-dir",
                 "--headless", "--max-memory", "--profile-at", "--leak", "--leak-at"):
        assert flag in result.stdout
