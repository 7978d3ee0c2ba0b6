"""Bad input gets one clear line on stderr and exit 2, before any training starts."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import run_cli

from tui.cli import main

# On a CUDA machine these options are valid: the bad-input cases only hold without CUDA.
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")

TINY_ARGS = ["--device", "cpu", "--layers", "1", "--heads", "2", "--dim", "32", "--seq-len", "16",
             "--block-size", "32", "--batch-size", "4"]


@pytest.mark.parametrize("args,needle", [
    (["--batch-size", "0"], "--batch-size must be a positive integer"),
    (["--seq-len", "-3"], "--seq-len must be a positive integer"),
    (["--dim", "30", "--heads", "4"], "divisible by --heads"),
    (["--amp", "fp8"], "invalid choice: 'fp8'"),
    (["--device", "tpu"], "unknown device 'tpu'"),
    pytest.param(["--device", "cuda"], "CUDA is not available", marks=NO_CUDA),
    pytest.param(["--device", "cuda:1"], "CUDA is not available", marks=NO_CUDA),
    (["--seq-len", "256"], "above the block size 128"),
    (["--attention", "flash"], "invalid choice: 'flash'"),
    (["--steps", "-1"], "--steps must be zero or a positive integer"),
    (["--steps", "ten"], "'ten' is not an integer"),
    (["--lr", "0"], "--lr must be a positive finite number"),
    (["--lr", "nan"], "--lr must be a positive finite number"),
    (["--max-memory", "lots"], "cannot read 'lots' as a size"),
    (["--leak", "tensors"], "invalid choice: 'tensors'"),
    (["--device", "cuda:x"], "not of the form cuda:N"),
    (["--leak-stop-at", "5"], "--leak-stop-at needs --leak-at"),
    (["--leak-at", "9", "--leak-stop-at", "5"], "must come after --leak-at 9"),
    (["--profile-active", "0"], "--profile-active must be a positive integer"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--log-every", "0"], "--log-every must be a positive integer"),
    (["--grad-clip", "nan"], "--grad-clip must be zero or a positive finite number"),
    (["--seed", str(2**64)], "--seed must be between 0 and 2**63 - 1"),
    (["--block-size", "100000"], "--block-size 100000 is above 8192"),
    (["--seq-len", "8000", "--block-size", "8000"], "longer than the shipped text allows"),
])
def test_bad_train_options_exit_2_with_one_line(args, needle, capsys):
    code = main(["train", "--headless", *args])
    err = capsys.readouterr().err
    assert code == 2
    assert needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_unwritable_run_dir_is_bad_input(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code = main(["train", "--headless", "--run-dir", str(blocker / "runs")])
    err = capsys.readouterr().err
    assert code == 2 and "cannot create run directory" in err and err.count("\n") == 1
    assert blocker.read_text() == "not a folder"


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "train" in capsys.readouterr().out


def test_dashboard_without_a_terminal_points_at_headless(tmp_path):
    result = run_cli("train", "--run-dir", str(tmp_path))
    assert result.returncode == 2
    assert "--headless" in result.stderr and result.stderr.count("\n") == 1
    assert not list(tmp_path.iterdir())  # nothing was created


def test_headless_subprocess_end_to_end(tmp_path):
    result = run_cli("train", "--headless", "--steps", "12", "--log-every", "4",
                     "--run-dir", str(tmp_path), *TINY_ARGS)
    assert result.returncode == 0, result.stderr
    assert "step     12" in result.stdout and "run_finished" in result.stdout
    (run,) = tmp_path.iterdir()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert sum(1 for r in rows if "event" not in r) == 12
    config = json.loads((run / "config.json").read_text())
    assert config["device"] == "cpu" and config["amp"] == "auto"  # as given
    started = next(r for r in rows if r.get("event") == "run_started")
    assert started["device"] == "cpu" and started["amp"] == "bf16"  # as resolved at run start


def test_a_cuda_runs_config_loads_on_a_machine_without_cuda():
    from trainer.config import TrainConfig

    config = TrainConfig.from_json({**TrainConfig(device="cuda:3").to_json(), "future_key": 1})
    assert config.device == "cuda:3" and config.batch_size == 16
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            config.resolve()


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
