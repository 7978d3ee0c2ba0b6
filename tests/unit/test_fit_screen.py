"""`memtop fit` as a new user read it on the screen (issue 41's follow-up): nothing fits, the
refine counter, the rest level's drift, the fresh point's band, verify's verdicts, interrupted
points and checks, and compare of fit runs."""

from __future__ import annotations

import pytest
from fit_points import (
    GRID,
    MIB,
    cpu_point,
    fit_meta,
)

from probes.analysis.fit import (
    OVER,
    band_at,
    fit_points,
)
from probes.analysis.fit_file import fit_document, verification, write_fit
from probes.analysis.fit_text import fit_lines
from probes.tools.units import format_bytes


# ---- what a new user read on the screen (issue 41's follow-up) -------------------------------
def test_nothing_fits_is_said_with_what_the_smallest_point_needs():
    """The smallest point measured over the budget: the screen says nothing fits and what
    that point needs beside what the process holds, not "0 probe point(s) measured"; the
    probe ended for the budget, so `memtop fit` exits 3."""
    from tui.fit_run import finished_code

    over = dict(cpu_point(1, 128), status=OVER, reason="its peak is over the budget")
    rest = [{"batch_size": b, "seq_len": t, "status": "not run",
             "reason": "a smaller point was over the budget"} for b, t in GRID[1:]]
    doc = fit_document(fit_meta(budget_bytes=300 * MIB, held_bytes=233 * MIB), [over, *rest],
                       "finished")
    text = "\n".join(fit_lines(doc))
    peak = format_bytes(over["peak_bytes"])
    assert f"nothing fits 300 MiB: B=1 T=128, the smallest point, needs {peak}" in \
        text.replace("\n", " ")
    assert "holds ~233 MiB" in text and "probe point(s) measured" not in text
    assert f"{peak}  over budget" in text  # the point's own figure in the table
    assert finished_code(doc) == 3
    assert finished_code(fit_document(fit_meta(), [cpu_point(b, t) for b, t in GRID],
                                      "finished")) == 0
    ran = fit_document(fit_meta(), [cpu_point(1, 128), dict(cpu_point(4, 32), status=OVER)],
                       "finished")  # B=1 fits, the next point does not: still no answer
    assert finished_code(ran) == 3 and "ran under it, B=4 T=32 did not" in " ".join(
        fit_lines(ran))


def test_refine_points_are_not_counted_past_the_planned_total():
    import io

    from probes.records import Event
    from tui.fit_run import PointPrinter

    out = io.StringIO()
    printer = PointPrinter(2, out)
    for i, role in enumerate(("probe", "probe", "refine", "refine")):
        printer(Event("fit_point", i, 0.0, dict(cpu_point(1 + i, 128), role=role)))
    labels = [line.split("  ")[0] for line in out.getvalue().splitlines()]
    assert labels == ["point 1/2", "point 2/2", "refine 1", "refine 2"]


def test_the_rest_levels_drift_is_a_whole_sentence_that_says_which_figure_is_which():
    pts = [cpu_point(b, t, rest_extra=11 * MIB * i) for i, (b, t) in enumerate(GRID)]
    text = " ".join(fit_lines(fit_document(fit_meta(), pts, "finished")))
    assert "the rest level grew 44.0 MiB over the probe" in text
    assert "the table predicts each point on its own rest level, the answers below on the " \
           "first point's, as a fresh run holds one shape's caches" in text


def test_a_fresh_process_point_widens_the_band_by_its_distance_from_the_prediction():
    """The probe's largest point again in a fresh process, 3% over the prediction (another
    process's rest level and heap): not fitted, predicted as an answer is; the band holds it,
    and the screen shows it beside the probe's points."""
    pts = [cpu_point(b, t) for b, t in GRID]
    fresh = dict(cpu_point(4, 128), role="fresh")
    fresh["peak_bytes"] = round(fresh["peak_bytes"] * 1.03)
    fit = fit_points([*pts, fresh], "cpu")
    plain = fit_points(pts, "cpu")
    assert fit["parts"] == plain["parts"] and fit["max_residual"] == plain["max_residual"]
    assert fit["run_to_run"] == pytest.approx(0.03 / 1.03, rel=1e-6)
    assert fit["band"] == pytest.approx(fit["run_to_run"]) and plain["run_to_run"] is None
    # the fresh process's bytes grow with the step's part: far past the probe, a wider band
    assert band_at(fit, 64, 128) > band_at(fit, 4, 128) >= fit["run_to_run"] * 0.99
    assert band_at(plain, 64, 128) == band_at(plain, 4, 128) == 0.0
    doc = fit_document(fit_meta(), [*pts, fresh], "finished")
    lines = fit_lines(doc)
    row = next(line for line in lines if line.endswith("  fresh"))
    assert row.split()[:2] == ["4", "128"] and "+2.9%" in row
    assert "run to run: a fresh process at B=4 T=128 measured" in " ".join(lines)


def test_verify_agrees_only_within_the_stated_band():
    """The largest B measured 1.5% over its prediction where the band says ±x% < 1.5%: under
    the budget, outside the band, not "agrees"."""
    doc = fit_document(fit_meta(), [dict(cpu_point(b, t), spread=0.01) for b, t in GRID],
                       "finished")
    b = doc["answer"]["batch"]["largest"]
    band = band_at(doc["fit"], b, 128)
    assert 0.005 < band < 0.015
    point = cpu_point(b, 128)
    high = dict(point, peak_bytes=round(point["peak_bytes"] * 1.015))
    row = verification("largest B", high, doc, True, 0, "v")
    assert row["measured_bytes"] < doc["budget_bytes"]
    assert row["agrees"] is False and row["verdict"] == "outside the band"
    assert row["band"] == pytest.approx(band)
    doc["verification"] = [row]
    text = " ".join(line.strip() for line in fit_lines(doc))
    assert f"under the budget, outside the band ±{band:.1%}" in text and ": agrees" not in text
    inside = dict(point, peak_bytes=round(point["peak_bytes"] * (1 + band / 2)))
    assert verification("largest B", inside, doc, True, 0, "v")["agrees"] is True
    limit = doc["answer"]["limit_bytes"]
    past = dict(point, peak_bytes=limit + MIB)  # under the budget, over its headroom line
    doc["verification"] = [verification("largest B", past, doc, True, 0, "v")]
    assert f"over the {format_bytes(limit)} headroom line" in " ".join(
        line.strip() for line in fit_lines(doc))


def test_an_interrupted_verification_is_not_checked():
    from probes.analysis.fit import INTERRUPTED

    doc = fit_document(fit_meta(), [cpu_point(b, t) for b, t in GRID], "finished")
    b = doc["answer"]["batch"]["largest"]
    stopped = {"batch_size": b, "seq_len": 128, "status": INTERRUPTED,
               "reason": "interrupted (SIGINT)"}
    row = verification("largest B", stopped, doc, True, 130, "v")
    assert row["agrees"] is None and row["exit_code"] == 130
    doc["verification"] = [row]
    text = " ".join(fit_lines(doc))
    assert "not checked: interrupted" in text and "DISAGREES" not in text


def test_an_interrupted_point_says_interrupted_once_and_no_fit_is_not_called_above():
    from probes.analysis.fit import INTERRUPTED
    from probes.records.event_text import fit_point_text

    stopped = {"batch_size": 4, "seq_len": 32, "status": INTERRUPTED,
               "reason": "interrupted (SIGINT)"}
    assert fit_point_text(stopped) == "B=4 T=32: interrupted (SIGINT)"
    doc = fit_document(fit_meta(), [cpu_point(1, 128), stopped], "interrupted")
    lines = fit_lines(doc)
    assert not any("interrupted: interrupted" in line for line in lines)
    assert not any("the fit above" in line for line in lines)
    assert "too few points were measured before the stop" in " ".join(lines)


def test_compare_names_a_fit_runs_fields_and_says_why_one_has_no_answer(tmp_path):
    from factories import write_run

    from probes.analysis.compare.compare import compare_runs
    from probes.analysis.compare.text import render_markdown

    fit_cfg = {"vary": "both", "memory": 700 * MIB, "headroom_pct": 10.0,
               "points": [[1, 128], [2, 128]]}
    a = write_run(tmp_path / "a", seq_len=128, mode="fit", fit=fit_cfg)
    b = write_run(tmp_path / "b", seq_len=128, mode="fit",
                  fit=dict(fit_cfg, memory=2048 * MIB, points=[[1, 128]]))
    write_fit(a, fit_document(fit_meta(), [cpu_point(1, 128)], "finished"))  # one point: no fit
    write_fit(b, fit_document(fit_meta(), [cpu_point(x, t) for x, t in GRID], "finished"))
    text = render_markdown(compare_runs([a, b]))
    changed = next(line for line in text.splitlines() if line.startswith("- Changed"))
    assert "fit.memory 734003200 -> 2147483648" in changed and "{" not in changed
    assert "points" not in changed  # the planned grid follows B, T and fit.vary
    no_answer = next(line for line in text.splitlines() if line.startswith("  - A: "))
    assert "no fit: 1 probe point(s) measured" in no_answer
    assert "n/a" not in no_answer and "today's size" not in no_answer
    assert "- tokens/s: n/a: `memtop fit` probes run several shapes" in text
    assert "Step split" not in text  # phases of several shapes: not compared
