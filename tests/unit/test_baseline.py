"""`memtop train --baseline RUN`: live deltas on the dashboard and the comparison in the report."""

from __future__ import annotations

import json

import pytest
from factories import make_sample, wait_for, write_run

from probes.analysis.baseline import LiveFigures, deltas
from tui.cli import main
from tui.format_panels import baseline_text


def _timed_step(step, ms, peak=100, profiling=False):
    """A step of ``ms`` (its tokens/s with it), as the live figures read them."""
    return make_sample(step, tokens_per_s=1000 / ms, step_ms=ms, peak_allocated_bytes=peak,
                       profiling=profiling)


def test_live_figures_skip_warmup_and_profiled_steps_and_give_deltas():
    live = LiveFigures(warmup_steps=2)
    for step, ms in ((1, 500.0), (2, 400.0), (3, 20.0), (4, 20.0), (5, 20.0)):
        live.push(_timed_step(step, ms, peak=50 if step == 1 else 100))
    live.push(_timed_step(6, 900.0, profiling=True))
    now = live.figures()
    assert now == {"tokens_per_s": 50.0, "step_ms": 20.0, "peak_allocated_bytes": 100}
    change = deltas({"tokens_per_s": 40.0, "step_ms": 25.0, "peak_allocated_bytes": None}, now)
    assert change["tokens_per_s"] == pytest.approx(0.25)
    assert change["step_ms"] == pytest.approx(-0.2)
    assert change["peak_allocated_bytes"] is None
    text = baseline_text("base", {"tokens_per_s": 40.0, "step_ms": 25.0,
                                  "peak_allocated_bytes": 2**20}, now, change)
    assert text.startswith("vs baseline base: tok/s 50 (+25%)") and "(-20%)" in text


def test_bad_baseline_is_one_line_and_exit_2(tmp_path, capsys):
    code = main(["train", "--headless", "--device", "cpu", "--baseline",
                 str(tmp_path / "nope"), "--run-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--baseline" in err and "does not exist" in err and "\n" not in err
    assert not (tmp_path / "runs").exists()


async def test_dashboard_shows_deltas_and_the_report_compares(tiny_config, tmp_path):
    from probes.runfolder import create_run_dir
    from tui.app import MemtopApp

    base = write_run(tmp_path / "base", step_ms=1000.0)  # slow on purpose: a clear delta
    config = tiny_config(steps=8, baseline=str(base))
    app = MemtopApp.for_run(config, create_run_dir(config.run_dir), refresh_s=0.1,
                            freeze_gc=False)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: "%)" in app.baseline_bar.text, "a live delta")
            text = app.baseline_bar.text
            assert text.startswith("vs baseline base: tok/s") and "step p50" in text
            await wait_for(pilot, lambda: "FINISHED" in app.header_bar.text, "the run's end")
            await pilot.press("q")
            await wait_for(pilot, lambda: app.return_code is not None, "the app to exit")
    finally:
        app.shutdown(timeout_s=60)
    report = json.loads((app.run_dir / "report.json").read_text())
    section = report["baseline"]
    assert section["run"] == str(base) and "error" not in section
    comparison = section["comparison"]
    assert comparison["step_ms"]["ratio"] < 0.5  # the tiny model is far faster than 1 s/step
    assert "## Against the baseline" in (app.run_dir / "report.md").read_text()
