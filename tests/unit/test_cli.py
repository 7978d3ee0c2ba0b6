"""Bad input gets one clear line on stderr and exit 2, before any training starts (the CLI's
main() in this process; the `memtop` process itself: tests/integration/test_cli_process.py)."""

from __future__ import annotations

import pytest
import torch

from tui.cli import main

# On a CUDA machine these options are valid: the bad-input cases only hold without CUDA.
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")


@pytest.mark.parametrize("args,needle", [
    (["--batch-size", "0"], "--batch-size must be a positive integer"),
    (["--seq-len", "-3"], "--seq-len must be a positive integer"),
    (["--dim", "30", "--heads", "4"], "divisible by --heads"),
    (["--amp", "fp8"], "invalid choice: 'fp8'"),
    (["--device", "tpu"], "unknown device 'tpu'"),
    pytest.param(["--device", "cuda"], "CUDA is not available", marks=NO_CUDA),
    pytest.param(["--device", "cuda:1"], "CUDA is not available", marks=NO_CUDA),
    (["--seq-len", "256", "--block-size", "128"], "above the block size 128"),
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
    (["--bogus"], "memtop train: unrecognized arguments: --bogus"),
    (["--stesp", "3"], "memtop train: unrecognized arguments: --stesp 3 (did you mean --steps?)"),
    (["--device", "cpu", "--max-memory", "1KiB"], "below what this process already holds"),
    pytest.param(["--max-memory", "5MiB"], "holds (RSS", marks=NO_CUDA),  # auto: the CPU here
    (["--steps", "2", "--profile-at", "1000"], "after the run's last step (--steps 2)"),
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


def test_a_cuda_runs_config_loads_on_a_machine_without_cuda():
    from trainer.config import TrainConfig

    config = TrainConfig.from_json({**TrainConfig(device="cuda:3").to_json(), "future_key": 1})
    assert config.device == "cuda:3" and config.batch_size == 16
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            config.resolve()


def test_runs_without_a_runs_folder_says_where_it_looked(tmp_path):
    from factories import run_cli

    result = run_cli("runs", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    line = result.stderr.strip()
    assert line.startswith(f"memtop runs: {tmp_path.resolve() / 'runs'} does not exist")
    assert "`memtop runs DIR`" in line and "\n" not in line
    (tmp_path / "afile").write_text("x")
    line = run_cli("runs", str(tmp_path / "afile"), cwd=tmp_path).stderr.strip()
    assert "afile is not a folder" in line and "`memtop runs DIR`" in line
