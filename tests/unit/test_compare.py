"""`memtop compare`: the rules (one variable changed, noise, loss agreement), the gates, the
refusals, and a real fp32 / bf16 pair of tiny runs."""

from __future__ import annotations

import json
import random

import pytest
from factories import RUN_CONFIG, in_thread, write_run

from probes import records as R
from probes.analysis.compare.compare import (
    changed_variables,
    compare_runs,
    load_run,
    one_variable_warning,
)
from probes.analysis.compare.stats import loss_agreement, median_ratio
from probes.records import Event
from probes.runfolder import json_line
from tui.cli import main


def test_one_variable_changed_is_detected():
    a = dict(RUN_CONFIG)
    one = changed_variables(a, dict(RUN_CONFIG, amp="bf16"))
    assert [c["name"] for c in one] == ["amp"] and one_variable_warning(one) is None
    two = changed_variables(a, dict(RUN_CONFIG, amp="bf16", batch_size=8))
    warning = one_variable_warning(two)
    assert warning is not None and "amp" in warning and "batch_size" in warning
    assert changed_variables(a, dict(RUN_CONFIG)) == []


def test_noise_rule_calls_a_shift_inside_the_noise_no_difference():
    rng = random.Random(3)
    a = [10 + rng.gauss(0, 1) for _ in range(200)]
    same = [10 + rng.gauss(0, 1) for _ in range(200)]
    slower = [13 + rng.gauss(0, 1) for _ in range(200)]
    r = median_ratio(a, same)
    assert r is not None and not r["measurable"] and not r["outside_band"]
    r = median_ratio(a, slower)
    assert r is not None and r["measurable"] and r["low"] > 1.2
    assert median_ratio([1.0], [2.0]) is None  # too few steps for a band


def test_loss_agreement_and_where_curves_part():
    a = {s: 5.0 - 0.02 * s for s in range(1, 61)}
    close = {s: v * 1.01 for s, v in a.items()}
    ok = loss_agreement(a, close, tolerance=0.05)
    assert ok["agree"] and ok["parted_at_step"] is None and ok["common_steps"] == 60
    apart = {s: v + (0.1 * (s - 30) if s >= 30 else 0.0) for s, v in a.items()}
    bad = loss_agreement(a, apart, tolerance=0.05)
    assert not bad["agree"] and 30 < bad["parted_at_step"] < 45


def test_compare_writes_files_and_names_the_change(tmp_path, capsys):
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b", amp="bf16", step_ms=5.0, seed=1)
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "Changed: amp 'off' -> 'bf16'" in out and "WARNING" not in out
    assert "faster" in out and "Precision check" in out
    data = json.loads((tmp_path / "out" / "compare.json").read_text())
    c = data["comparisons"][0]
    assert c["tokens_per_s"]["measurable"] and c["tokens_per_s"]["ratio"] == pytest.approx(2, 0.1)
    assert c["precision_check"]["agreement"]["agree"] is True
    assert (tmp_path / "out" / "compare.md").read_text().startswith("# memtop compare")
    assert "| peak heap used " in out and "peak allocated" not in out  # two CPU runs


def test_two_changes_warn(tmp_path, capsys):
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b", amp="bf16", batch_size=8)
    assert main(["compare", str(a), str(b), "--out", str(tmp_path)]) == 0
    assert "WARNING: 2 variables changed (amp, batch_size)" in capsys.readouterr().out


def test_precision_check_says_where_losses_part(tmp_path):
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b", amp="fp16", part_at=40)
    check = compare_runs([a, b])["comparisons"][0]["precision_check"]
    assert check["agreement"]["agree"] is False and check["agreement"]["parted_at_step"] >= 40


@pytest.mark.parametrize("b_kw,flags,code", [
    ({"step_ms": 13.0}, ["--fail-if-slower", "10"], 1),  # 23% slower, measurably
    ({"step_ms": 13.0}, ["--fail-if-slower", "40"], 0),
    ({"step_ms": 10.0, "seed": 5}, ["--fail-if-slower", "0"], 0),  # inside the noise
    ({"peak": 1200}, ["--fail-if-bigger", "10"], 1),
    ({"peak": 1200}, ["--fail-if-bigger", "25"], 0),
    ({"peak": 800, "step_ms": 8.0}, ["--fail-if-bigger", "0", "--fail-if-slower", "0"], 0),
])
def test_fail_if_gates_exit_codes(tmp_path, capsys, b_kw, flags, code):
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b", **b_kw)
    assert main(["compare", str(a), str(b), "--out", str(tmp_path), *flags]) == code
    err = capsys.readouterr().err
    assert ("FAIL" in err) == (code == 1)


def test_refusals_are_one_line_and_exit_2(tmp_path, capsys):
    a = write_run(tmp_path / "a")
    other = write_run(tmp_path / "other", dim=64)
    (tmp_path / "junk").mkdir()
    cases = [
        ([str(a), str(tmp_path / "junk")], "is neither a memtop run folder nor a folder of runs"),
        ([str(a), str(tmp_path / "missing")], "does not exist"),
        ([str(a)], "at least two run folders"),
        ([str(a), str(other)], "train different models (dim 32 vs 64); pass --force"),
        ([str(a), str(a), "--fail-if-slower", "-3"], "must be zero or more"),
    ]
    for args, needle in cases:
        assert main(["compare", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and "\n" not in err and "Traceback" not in err
    assert main(["compare", str(a), str(other), "--force", "--out", str(tmp_path)]) == 0


def test_real_fp32_and_bf16_runs_agree(tiny_config, tmp_path):
    from trainer.loop import Trainer

    def train(amp):
        cfg = tiny_config(amp=amp, steps=25)
        from probes.runfolder import create_run_dir

        run_dir = create_run_dir(cfg.run_dir)
        trainer = Trainer(cfg, run_dir, listen=False)
        assert trainer.run() == 0
        return run_dir

    a, b = in_thread(train, "off"), in_thread(train, "bf16")
    fa = load_run(a)
    assert fa.variables["amp"] == "off" and len(fa.step_ms) == 25 - 2
    c = compare_runs([a, b])["comparisons"][0]
    assert [x["name"] for x in c["changed"]] == ["amp"]
    check = c["precision_check"]
    assert check is not None and check["finite"] == {"a": True, "b": True}
    assert check["agreement"]["agree"] is True and check["agreement"]["common_steps"] == 25


def test_profiler_windows_are_compared(tmp_path):
    """Exercise 5's measurement: two runs whose one change is record_shapes, each with a
    window; the active steps, export/analysis seconds and trace sizes are set side by side."""
    runs = []
    for name, shapes, trace in (("a", False, 1000), ("b", True, 3000)):
        run = write_run(tmp_path / name, profile_record_shapes=shapes)
        (run / "profiles" / "step-5").mkdir(parents=True)
        (run / "profiles" / "step-5" / "trace.json").write_bytes(b"x" * trace)
        rows = (run / "metrics.jsonl").read_text().splitlines()
        events = [Event(R.PROFILE_STARTED, 5, 0.1, {"wait": 1, "warmup": 1, "active": 3,
                                                    "record_shapes": shapes,
                                                    "dir": "profiles/step-5"}),
                  Event(R.PROFILE_ANALYSING, 9, 0.2, {"dir": "profiles/step-5",
                                                      "export_s": 0.1 * (1 + shapes)}),
                  Event(R.PROFILE_DONE, 12, 0.3, {"dir": "profiles/step-5", "analysis_s": 0.5,
                                                  "top_ops": []})]
        rows[6:6] = [json_line(e.to_json()) for e in events]
        (run / "metrics.jsonl").write_text("\n".join(rows) + "\n")
        runs.append(run)
    fa = load_run(runs[0])
    assert fa.windows[0]["active_step_ms"] and len(fa.windows[0]["active_step_ms"]) == 3
    c = compare_runs(runs)["comparisons"][0]
    assert [x["name"] for x in c["changed"]] == ["profile_record_shapes"]
    p = c["profiler"]
    assert p["a"]["trace_bytes"] == 1000 and p["b"]["trace_bytes"] == 3000
    assert p["b"]["export_s"] == pytest.approx(0.2) and p["b"]["record_shapes"] == [True]


def test_a_repeated_baseline_sets_the_run_to_run_noise_floor(tmp_path):
    a = write_run(tmp_path / "a")
    a2 = write_run(tmp_path / "a2", step_ms=12.0, seed=1)  # nothing changed, yet 20% slower
    b = write_run(tmp_path / "b", amp="bf16", step_ms=11.0, seed=2)
    alone = compare_runs([a, b])["comparisons"][0]
    assert alone["tokens_per_s"]["measurable"]  # within-run noise alone calls it a change
    result = compare_runs([a, a2, b])
    noise = result["run_to_run_noise"]
    assert noise["from"] == ["a2"]
    assert noise["tokens_per_s"] == pytest.approx(1 - 1 / 1.2, abs=0.03)  # a2: 1/1.2 of A's
    c = result["comparisons"][1]
    assert not c["tokens_per_s"]["measurable"] and c["tokens_per_s"]["within_run_to_run_noise"]
    assert "A/A run-to-run noise" in c["tokens_per_s_verdict"]
    assert compare_runs([a, b])["run_to_run_noise"] is None
    # A and its repeat alone: no floor measured from the run it would judge (it was circular:
    # "noise from the repeated baseline ±20%" beside that run's own "1.2x, slower")
    alone_aa = compare_runs([a, a2])
    assert alone_aa["run_to_run_noise"] is None
    assert alone_aa["comparisons"][0]["tokens_per_s"]["measurable"]  # a code change shows


def test_runs_and_compare_take_folders_of_runs_one_level_deeper(tmp_path, capsys):
    """--run-dir runs/fp32 and runs/bf16 (README's compare recipe): `memtop runs runs` lists
    both, `memtop compare runs/fp32 runs/bf16` compares their newest and says which it took."""
    a = write_run(tmp_path / "runs" / "fp32" / "20260101-000000-aaaaaa")
    b = write_run(tmp_path / "runs" / "bf16" / "20260101-000100-bbbbbb", amp="bf16")
    assert main(["runs", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "fp32/20260101-000000-aaaaaa" in out and "bf16/20260101-000100-bbbbbb" in out
    assert main(["compare", str(a.parent), str(b.parent), "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert f"comparing its newest, {a}" in err and f"comparing its newest, {b}" in err


def _with_split(run, backward_ms: float, seed: int):
    """The run's step rows given a step split around fixed phases (issue 26)."""
    rng = random.Random(seed)
    path = run / "metrics.jsonl"
    lines = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if "event" not in row:
            row.update(data_wait_ms=2.0 * (1 + 0.1 * rng.random()),
                       forward_ms=5.0 * (1 + 0.1 * rng.random()),
                       backward_ms=backward_ms * (1 + 0.1 * rng.random()),
                       optimizer_ms=1.0 * (1 + 0.1 * rng.random()), other_ms=0.5)
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return run


def test_compare_names_the_phase_a_change_moved(tmp_path, capsys):
    a = _with_split(write_run(tmp_path / "a"), backward_ms=10.0, seed=0)
    b = _with_split(write_run(tmp_path / "b", batch_size=8, seed=1), backward_ms=16.0, seed=1)
    old = write_run(tmp_path / "old", seed=2)  # null phases, as a run before the split reads
    assert main(["compare", str(a), str(b), str(old), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "The change moved backward most: +6" in out
    data = json.loads((tmp_path / "out" / "compare.json").read_text())
    moved, none = (c["phases"] for c in data["comparisons"])
    assert moved["moved"] == "backward_ms" and not moved["phases"]["forward_ms"]["measurable"]
    assert none is None and "Step split: n/a" in out


def test_a_killed_run_is_interrupted_not_live(tmp_path):
    """No run_finished and no process answering its socket: `memtop runs` said interrupted,
    compare said live."""
    from factories import METRICS

    run = write_run(tmp_path / "killed")
    rows = (run / METRICS).read_text().splitlines()
    (run / METRICS).write_text("\n".join(rows[:-1]) + "\n")
    assert load_run(run).outcome == "interrupted"
    assert load_run(write_run(tmp_path / "done")).outcome == "finished"


def test_a_phase_that_moved_under_a_percent_of_the_step_is_not_named():
    """compare named a 0.01 ms data wait 11% shorter as the phase the change "moved most"."""
    from probes.analysis.compare.phases import phase_changes

    rng = random.Random(4)

    def phases(wait_ms):
        return {"data_wait_ms": [wait_ms * (1 + 0.01 * rng.random()) for _ in range(200)],
                "forward_ms": [30.0 * (1 + 0.1 * rng.random()) for _ in range(200)],
                "backward_ms": [45.0 * (1 + 0.1 * rng.random()) for _ in range(200)]}

    moved = phase_changes(phases(0.010), phases(0.009), median_ratio)
    assert moved["phases"]["data_wait_ms"]["measurable"]  # the noise rule alone calls it
    assert moved["moved"] is None


def test_a_training_run_and_an_inference_run_are_refused_even_with_force(tmp_path, capsys):
    """Issue 44 item 10: "0.171x the baseline … slower" of a training run against decode steps;
    refused in one line, exit 2, as runs of different models are (--force does not apply)."""
    train = write_run(tmp_path / "train")
    infer = write_run(tmp_path / "infer", mode="infer")
    for args in ([str(train), str(infer)], [str(infer), str(train), "--force"]):
        assert main(["compare", *args, "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "Traceback" not in err, err
        assert "training run" in err and "inference run" in err, err
    assert not (tmp_path / "out").exists()


def test_a_folder_compared_with_itself_says_so(tmp_path, capsys):
    """Issue 44 item 10: not "an A/A comparison" but the same folder on both sides, and it sets
    no run-to-run noise floor for the other runs."""
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b", amp="bf16", step_ms=10.5, seed=3)
    assert main(["compare", str(a), str(a), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "both sides are the same folder" in out and str(a) in out
    assert "an A/A comparison" not in out.replace("an A/A comparison needs", "")
    result = compare_runs([a, a, b])
    assert result["run_to_run_noise"] is None
    assert [c["same_folder"] for c in result["comparisons"]] == [True, False]
