"""`memtop infer` as a process: a refusal is one line on stderr and exit 2 (the runner, its rows
and every other refusal in this process: tests/unit/test_infer.py)."""

from __future__ import annotations

from factories import run_cli


def test_refusal_in_a_real_process(tmp_path):
    # both typed: a fresh model's block would otherwise grow to fit the tokens asked for
    result = run_cli("infer", "--headless", "--device", "cpu", "--block-size", "64",
                     "--new-tokens", "200", "--run-dir", str(tmp_path / "runs"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "past the model's block size" in result.stderr
