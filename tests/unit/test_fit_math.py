"""`memtop fit`'s math without torch (probes/analysis/fit.py, fit_answer.py, fit_file.py,
fit_text.py): points whose parts follow known laws give those laws back, the largest sizes
solve them exactly, a noisy fit widens its band and says so, and fit.json reads back."""

from __future__ import annotations

import json
import math

import pytest
from fit_points import (
    ACT_BT,
    ACT_BT2,
    BETA,
    GRID,
    MIB,
    OPT,
    PARAMS,
    RUNTIME,
    TMP0,
    TMP_BT,
    cpu_point,
    fit_meta,
    true_peak,
)

from probes.analysis.fit import (
    GUARD,
    OVER,
    FitError,
    band_at,
    fit_points,
    largest_batch,
    largest_seq,
    predict,
)
from probes.analysis.fit_answer import answer, limit_bytes, refine_points
from probes.analysis.fit_file import fit_document, read_fit, verification, write_fit
from probes.analysis.fit_plan import probe_grid
from probes.analysis.fit_text import WIDTH, fit_lines, headline
from probes.runfolder import RunFolderError


def test_the_grid_runs_smallest_first_and_refuses_an_axis_that_cannot_vary():
    assert probe_grid(16, 128, "batch") == [(1, 128), (2, 128), (4, 128)]
    assert probe_grid(16, 128, "context") == [(16, 32), (16, 64), (16, 128)]
    both = probe_grid(16, 128, "both")
    assert sorted(both) == sorted(GRID)
    sizes = [b * t for b, t in both]
    assert sizes == sorted(sizes)
    assert probe_grid(16, 64, "both", batches=[1, 2, 4], seq_lens=[32, 64]) == [
        (1, 64), (2, 64), (4, 32), (4, 64)]
    with pytest.raises(ValueError, match="--seq-len of at least 4"):
        probe_grid(16, 1, "context")
    with pytest.raises(ValueError, match="--vary must be one of"):
        probe_grid(16, 128, "sideways")


def test_exact_parts_give_their_laws_back_and_predict_far_sizes_exactly():
    fit = fit_points([cpu_point(b, t) for b, t in GRID], "cpu")
    assert fit["quadratic"] and fit["batch_varied"] and fit["seq_varied"]
    acts = next(p for p in fit["parts"] if p["name"] == "saved activations")
    assert acts["coef"][1] == pytest.approx(ACT_BT, rel=1e-6)
    assert acts["coef"][2] == pytest.approx(ACT_BT2, rel=1e-6)
    bwd = next(p for p in fit["parts"] if p["name"] == "backward and free heap")
    assert bwd["share"] == pytest.approx(BETA, rel=1e-6)  # it follows the step's tensors
    assert fit["max_residual"] < 1e-9 and not fit["poor"]
    for b, t in ((32, 128), (4, 1024), (64, 512)):  # 8x, 8x in T, 64x in B·T
        assert predict(fit, b, t)["peak_bytes"] == pytest.approx(true_peak(b, t), rel=1e-6)
    # the counter's own peak (heap peak) leaves out the parts outside it
    p = predict(fit, 16, 128)
    assert p["counter_peak_bytes"] == pytest.approx(
        PARAMS + OPT + RUNTIME + TMP0 + (ACT_BT + TMP_BT) * 16 * 128 + ACT_BT2 * 16 * 128**2,
        rel=1e-6)


def test_without_measured_scores_there_is_no_t_squared_term():
    fit = fit_points([cpu_point(b, t, quadratic=False) for b, t in GRID], "cpu")
    assert not fit["quadratic"] and fit["features"] == ["1", "B·T"]
    assert predict(fit, 4, 1024)["peak_bytes"] == pytest.approx(
        true_peak(4, 1024, quadratic=False), rel=1e-6)


def test_the_largest_sizes_solve_the_fit_exactly():
    fit = fit_points([cpu_point(b, t) for b, t in GRID], "cpu")
    limit = 2048 * MIB
    b = largest_batch(fit, 128, limit)
    assert true_peak(b, 128) <= limit < true_peak(b + 1, 128)
    t = largest_seq(fit, 16, limit)
    assert true_peak(16, t) == pytest.approx(limit, rel=1e-6)
    assert largest_batch(fit, 128, 100 * MIB) == 0 and largest_seq(fit, 16, 100 * MIB) == 0


def test_the_answer_caps_t_at_the_models_context_and_names_the_first_size_over():
    fit = fit_points([cpu_point(b, t) for b, t in GRID], "cpu")
    budget = 2048 * MIB
    ans = answer(fit, budget, 10.0, 16, 128, max_seq_len=256)
    limit = limit_bytes(budget, 10.0)
    assert ans["limit_bytes"] == limit == int(budget * 0.9)
    b = ans["batch"]
    assert true_peak(b["largest"], 128) <= limit < true_peak(b["largest"] + 1, 128)
    assert true_peak(b["over"], 128) > budget >= true_peak(b["over"] - 1, 128)
    c = ans["context"]
    assert c["largest"] == 256 and c["capped_by_context"] and c["memory_allows"] > 256
    assert c["over"] is None  # the context ends before the budget does
    uncapped = answer(fit, budget, 10.0, 16, 128, max_seq_len=None)["context"]
    assert uncapped["largest"] == c["memory_allows"]
    assert uncapped["over"] == math.floor(largest_seq(fit, 16, budget)) + 1
    assert ans["today"]["fits"]
    # what moves the limit: shares of the peak at the largest B, the biggest first
    shares = [m["share"] for m in ans["moves"]]
    assert shares == sorted(shares, reverse=True) and ans["moves"][0]["part"] == \
        "saved activations" and ans["moves"][0]["scores_share"] > 0


def test_a_noisy_fit_is_called_poor_and_gives_a_range():
    pts = [dict(cpu_point(b, t), spread=0.08) for b, t in GRID]  # steps 8% apart
    fit = fit_points(pts, "cpu")
    assert fit["poor"] and fit["band"] > 0.05
    ans = answer(fit, 2048 * MIB, 10.0, 16, 128, 128)
    b = ans["batch"]
    assert b["range"] and b["low"] < b["largest"] < b["high"]
    assert "–" in headline(fit_document(fit_meta(), pts, "finished"))  # a range, not a number
    lines = fit_lines(fit_document(fit_meta(), pts, "finished"))
    assert any("the fit is poor" in line for line in lines)


def test_the_band_grows_with_the_reach_past_the_probe():
    noises = [0.0, 0.0, 0.0, 0.0, 0.02]  # the largest point off its trend: a measured LOO
    fit = fit_points([cpu_point(b, t, noise=n) for (b, t), n in
                      zip(GRID, noises, strict=True)], "cpu")
    assert fit["extrapolation_error"] is not None and fit["extrapolation_ratio"] == 2
    inside = band_at(fit, 4, 128)
    assert inside == fit["band"]
    assert band_at(fit, 64, 128) > band_at(fit, 16, 128) > inside


def test_history_in_a_points_rest_level_is_not_a_residual():
    """A later point holds kernels cached for earlier shapes (+11 MiB each under CPU bf16):
    its residual compares its own step parts, and the prediction keeps the first point's."""
    pts = [cpu_point(b, t, rest_extra=11 * MIB * i) for i, (b, t) in enumerate(GRID)]
    fit = fit_points(pts, "cpu")
    assert fit["max_residual"] < 1e-9
    assert fit["rest_drift_bytes"] == 44 * MIB
    assert predict(fit, 32, 128)["peak_bytes"] == pytest.approx(true_peak(32, 128), rel=1e-6)


def test_points_noisier_than_their_sizes_give_no_batch_answer():
    noises = [0.0, 0.06, -0.05, 0.07, -0.06]  # ±6% of the peak: more than B = 1..4 moves it
    pts = [cpu_point(b, t, act_noise=n) for (b, t), n in zip(GRID, noises, strict=True)]
    fit = fit_points(pts, "cpu")
    assert fit["poor"]
    ans = answer(fit, 2048 * MIB, 10.0, 16, 128, 128)
    assert ans["batch"]["largest"] is None and "noisier" in ans["batch"]["why"]
    assert any("none found" in line for line in fit_lines(fit_document(fit_meta(), pts)))


def test_too_few_or_inseparable_points_make_no_fit():
    with pytest.raises(FitError, match="needs at least 2"):
        fit_points([cpu_point(1, 128)], "cpu")
    with pytest.raises(FitError, match="do not separate"):
        fit_points([cpu_point(2, 64), cpu_point(4, 32)], "cpu")  # one B·T
    over = dict(cpu_point(8, 128), status=OVER)
    with pytest.raises(FitError):
        fit_points([cpu_point(1, 128), over], "cpu")  # only ok points count


def test_refine_points_lie_between_the_probe_and_a_far_answer():
    fit = fit_points([cpu_point(b, t) for b, t in GRID], "cpu")
    ans = answer(fit, 2048 * MIB, 10.0, 16, 128, 1024)
    refine = refine_points(fit, ans)
    b_star, t_star = ans["batch"]["largest"], ans["context"]["largest"]
    assert (round(math.sqrt(4 * b_star)), 128) in refine
    assert (16, round(math.sqrt(128 * t_star))) in refine
    near = answer(fit, 470 * MIB, 0.0, 4, 128, 128)  # the answer is inside the probe
    assert refine_points(fit, near) == []


def test_fit_json_round_trips_and_a_partial_probe_is_a_valid_file(tmp_path):
    pts = [cpu_point(b, t) for b, t in GRID[:1]]
    doc = fit_document(fit_meta(), pts, "interrupted")  # one point: no fit, said why
    assert doc["fit"] is None and "at least 2" in doc["fit_error"]
    write_fit(tmp_path, doc)
    back = read_fit(tmp_path)
    assert back["state"] == "interrupted" and back["points"] == json.loads(json.dumps(pts))
    assert any("no fit:" in line for line in fit_lines(back))
    full = fit_document(fit_meta(), [cpu_point(b, t) for b, t in GRID], "finished")
    write_fit(tmp_path, full)
    assert read_fit(tmp_path)["answer"]["batch"]["largest"] == full["answer"]["batch"][
        "largest"]
    assert read_fit(tmp_path / "nothing-here") is None
    (tmp_path / "fit.json").write_text("{not json")
    with pytest.raises(RunFolderError, match="cannot be read as JSON"):
        read_fit(tmp_path)
    (tmp_path / "fit.json").write_text('{"points": [], "fit_version": 99}')
    with pytest.raises(RunFolderError, match="not a fit.json of this memtop"):
        read_fit(tmp_path)


def test_verification_rows_say_whether_the_run_agreed():
    doc = fit_document(fit_meta(), [cpu_point(b, t) for b, t in GRID], "finished")
    b = doc["answer"]["batch"]["largest"]
    under = dict(cpu_point(b, 128))
    row = verification("largest B", under, doc, True, 0, "verify/x")
    assert row["agrees"] and row["error"] == pytest.approx(0.0, abs=1e-6)
    over = dict(cpu_point(b, 128), peak_bytes=doc["budget_bytes"] + 1)
    assert not verification("largest B", over, doc, True, 0, "v")["agrees"]
    stopped = {"batch_size": b + 20, "seq_len": 128, "status": GUARD,
               "peak_bytes": doc["budget_bytes"] + 5, "guard_counter": "host RSS"}
    row = verification("first B over", stopped, doc, False, 3, "v")
    assert row["agrees"] and row["error"] is None  # a stopped run is not a measured peak
    assert not verification("first B over", None, doc, False, 1, "v")["agrees"]
    doc["verification"] = [row]
    assert any("stopped by the memory guard" in line for line in fit_lines(doc))


def test_the_screen_fits_80_columns():
    doc = fit_document(fit_meta(), [cpu_point(b, t) for b, t in GRID], "finished")
    lines = fit_lines(doc)
    assert all(len(line) <= WIDTH for line in lines), [ln for ln in lines if len(ln) > WIDTH]
    text = "\n".join(lines)
    assert "largest B at T=128" in text and "largest T at B=16" in text
    assert "moves the limit most" in text and "residual" in text
    assert headline(doc).startswith("fits B ≤ ")


def test_the_report_and_compare_read_fit_json(tmp_path):
    """A run folder with fit.json: `memtop report` gains "Will it fit?" (the same screen),
    `memtop compare` sets two answers side by side; a junk fit.json is said, not a crash."""
    from factories import write_run

    from probes.analysis.compare.compare import compare_runs
    from probes.analysis.compare.text import render_markdown
    from probes.analysis.report.build import build_report, write_report

    a = write_run(tmp_path / "a", seq_len=128)
    b = write_run(tmp_path / "b", seq_len=128, attention="sdpa")
    write_fit(a, fit_document(fit_meta(), [cpu_point(x, t) for x, t in GRID], "finished"))
    write_fit(b, fit_document(fit_meta(attention="sdpa"), [cpu_point(x, t, quadratic=False)
                                                       for x, t in GRID], "finished"))
    md = write_report(a).read_text()
    assert "## Will it fit?" in md and "**fits B ≤ " in md and "largest B at T=128" in md
    report = build_report(a)
    assert report["fit"]["answer"]["batch"]["largest"] >= 1
    result = compare_runs([a, b])
    fit = result["comparisons"][0]["fit"]
    assert fit["a"]["largest_batch"] < fit["b"]["largest_batch"]  # no T×T scores: more B
    text = render_markdown(result)
    assert "Will it fit (fit.json)" in text and "largest B: " in text
    (a / "fit.json").write_text("[1, 2")
    md = write_report(a).read_text()
    assert "fit.json could not be read" in md
    assert compare_runs([a, b])["comparisons"][0]["fit"]["a"]["error"]
    plain = write_run(tmp_path / "plain")
    assert "Will it fit" not in write_report(plain).read_text()
