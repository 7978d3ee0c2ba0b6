"""One rule for which steps count toward the peak (probes/records/step.py counts_toward_peak):
a profiler window's steps do not, in the sample (pane, headless) and the report alike."""

from __future__ import annotations

import pytest
from factories import RecordSink, make_sample

from probes.analysis.report import build_report
from probes.monitor import default_hooks
from probes.records import counts_toward_peak
from probes.runfolder import create_run_dir
from trainer.loop import Trainer


def test_the_rule_reads_samples_and_rows_alike():
    assert counts_toward_peak(make_sample(3))
    assert not counts_toward_peak(make_sample(3, profiling=True))
    assert not counts_toward_peak({"step": 3, "profiling": True})
    assert counts_toward_peak({"step": 3})


@pytest.mark.slow  # the profiler's start-up: ~3 s alone, more on a loaded machine
def test_a_profiler_window_does_not_raise_the_reported_peak(tiny_config):
    cfg = tiny_config(steps=16, warmup_steps=2, profile_at=[6], profile_active=2)
    sink = RecordSink()
    trainer = Trainer(cfg, create_run_dir(cfg.run_dir), sinks=[sink],
                      hooks=default_hooks(**cfg.hook_options()))
    trainer.start()
    assert trainer.join(120) and trainer.exit_code == 0
    after = [s for s in sink.samples if s.step > cfg.warmup_steps]
    traced = [s for s in after if s.profiling]
    assert traced, "the window traced no step"
    counted = max(s.step_peak_allocated_bytes for s in after if counts_toward_peak(s))
    # the run's peak, as the pane and headless show it, is the counted steps' high-water mark
    assert sink.samples[-1].peak_allocated_bytes == counted
    for s in traced:  # a traced step's own peak is kept in its row, not folded into the run's
        assert s.peak_allocated_bytes <= max(counted, s.step_peak_allocated_bytes)
    report = build_report(trainer.run_dir)
    assert report["results"]["peak_allocated_bytes"] == counted
    assert "a profiler window's traced steps" in report["results"]["peaks_note"]


def test_the_peak_starts_after_the_warmup_row_in_report_and_compare_alike():
    """The peak is reset once step `warmup` has been read, so that row still holds the
    warm-up's peak: CI once saw the report take it (308 MB against the run's 225 MB)."""
    from probes.analysis.measured import peak_steps

    rows = [{"step": 1, "peak_allocated_bytes": 300}, {"step": 2, "peak_allocated_bytes": 300},
            {"step": 3, "peak_allocated_bytes": 200},
            {"step": 4, "peak_allocated_bytes": 250, "profiling": True},
            {"step": 5, "peak_allocated_bytes": 210}]
    assert [r["step"] for r in peak_steps(rows, warmup=2)] == [3, 5]
    assert [r["step"] for r in peak_steps(rows, warmup=0)] == [1, 2, 3, 5]
    assert [r["step"] for r in peak_steps(rows[:2], warmup=2)] == [1, 2]  # nothing after it
