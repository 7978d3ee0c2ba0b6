"""A default follows the options the user typed (issue 38 §3): an option never typed is never
named in an error against one that was; two typed values that conflict are both named. One test
per pair of options with a dependent default, through the real parser."""

from __future__ import annotations

import pytest
from factories import run_cli

from tui.cli import build_parser
from tui.commands import infer, sweep, train


def train_config(*argv: str):
    return train.config_from_args(build_parser().parse_args(["train", "--headless", *argv]))


def infer_config(*argv: str):
    return infer.config_from_args(build_parser().parse_args(["infer", "--headless", *argv]))


def test_nothing_typed_is_every_default():
    cfg = train_config()
    assert (cfg.seq_len, cfg.block_size, cfg.heads, cfg.dim, cfg.steps) == (128, 128, 4, 128, 300)
    inf = infer_config()
    assert (inf.prompt_len, inf.new_tokens, inf.baseline_tokens, inf.block_size) == (64, 64, 8,
                                                                                     None)


@pytest.mark.parametrize("argv,expected", [
    (("--block-size", "64"), {"seq_len": 64, "block_size": 64}),  # T follows the block
    (("--seq-len", "256"), {"seq_len": 256, "block_size": 256}),  # the block follows T
    (("--dim", "30"), {"dim": 30, "heads": 3}),  # heads divide the width
    (("--heads", "3"), {"heads": 3, "dim": 129}),  # the width is a multiple of heads
    (("--profile-at", "299"), {"steps": 304}),  # the window ends before the run does
])
def test_train_defaults_follow_a_typed_option(argv, expected):
    cfg = train_config(*argv)
    assert {k: getattr(cfg, k) for k in expected} == expected


@pytest.mark.parametrize("argv,expected", [
    (("--new-tokens", "4"), {"new_tokens": 4, "baseline_tokens": 4}),
    (("--baseline-tokens", "80"), {"new_tokens": 80, "baseline_tokens": 80, "block_size": 144}),
    (("--new-tokens", "100"), {"prompt_len": 64, "block_size": 164}),  # a fresh block grows
    (("--prompt-len", "100"), {"new_tokens": 64, "block_size": 164}),
    (("--block-size", "32"), {"prompt_len": 16, "new_tokens": 16, "baseline_tokens": 8}),
    (("--heads", "3"), {"heads": 3}),
])
def test_infer_defaults_follow_a_typed_option(argv, expected):
    cfg = infer_config(*argv)
    assert {k: getattr(cfg, k) for k in expected} == expected
    cfg.fresh_model_config()  # the model it would build is valid too
    if argv[0] == "--heads":
        assert cfg.fresh_model_config().n_embd == 129


@pytest.mark.parametrize("command,argv,needle", [
    ("train", ("--seq-len", "256", "--block-size", "128"), "--seq-len 256 is above the block "
                                                            "size 128"),
    ("train", ("--dim", "30", "--heads", "4"), "--dim 30 must be divisible by --heads 4"),
    ("train", ("--profile-at", "50", "--steps", "40"), "--profile-at 50 is after"),
    ("infer", ("--new-tokens", "4", "--baseline-tokens", "8"), "--baseline-tokens 8 is more "
                                                               "than --new-tokens 4"),
    ("infer", ("--block-size", "32", "--prompt-len", "40"), "--prompt-len 40 leaves no room"),
])
def test_two_typed_values_that_conflict_are_both_named(command, argv, needle):
    build = train_config if command == "train" else infer_config
    with pytest.raises(ValueError, match=needle):
        build(*argv)


def test_a_weights_block_is_followed_once_read(tmp_path):
    """--weights of a run with a 32-token block: the prompt and new tokens not typed fit it."""
    from trainer.model import GPTConfig

    cfg = infer_config("--weights", str(tmp_path))  # the header is read later (prepare_model)
    cfg.check_against(GPTConfig(block_size=32, n_layer=1, n_head=2, n_embd=32), "weights.pt")
    assert (cfg.prompt_len, cfg.new_tokens, cfg.baseline_tokens) == (16, 16, 8)
    typed = infer_config("--weights", str(tmp_path), "--new-tokens", "30")
    with pytest.raises(ValueError, match="--prompt-len 16 \\+ --new-tokens 30"):
        typed.check_against(GPTConfig(block_size=32, n_layer=1, n_head=2, n_embd=32), "w.pt")


def test_sweep_heads_follow_each_width():
    args = build_parser().parse_args(["sweep", "--dim", "30,32", "--device", "cpu"])
    plan = sweep.plan_from_args(args)
    assert plan.heads is None
    commands = [plan.child_command(cell, plan.folder) for cell in plan.cells]
    assert all("--heads" not in cmd for cmd in commands)  # each cell's follows its --dim
    typed = sweep.plan_from_args(build_parser().parse_args(["sweep", "--heads", "2"]))
    assert typed.heads == 2 and "--heads" in typed.child_command(typed.cells[0], typed.folder)


def test_infer_with_only_new_tokens_runs(tmp_path):
    result = run_cli("infer", "--headless", "--new-tokens", "4", "--layers", "1", "--dim", "32",
                     "--heads", "2", "--batch-size", "2", "--prompt-len", "8", "--requests", "2",
                     "--profile-phase", "none", "--run-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "--baseline-tokens" not in result.stderr
