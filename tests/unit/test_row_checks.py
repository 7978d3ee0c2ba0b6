"""Rows read back go through the one schema's value checks: a step row with a negative byte
count, a non-finite counter or a value of the wrong type is a bad line for every reader (counted,
and the first one said), and an event missing a field its text needs reads "incomplete event",
never "None" (probes/records/step.py, probes/records/events.py)."""

from __future__ import annotations

import json

import pytest
from factories import write_junk_run

from probes import records as R
from probes.records import Event, StepSample, step_row_problem
from probes.runfolder import Follower, read_history, read_rows

GOOD = {"step": 3, "time_s": 0.3, "loss": 2.5, "tokens_per_s": 640.0, "step_ms": 100.0,
        "allocated_bytes": 4096, "reserved_bytes": 8192, "peak_allocated_bytes": 4096,
        "driver_used_bytes": 2**20, "host_rss_bytes": 2**20, "scale": None,
        "skipped_steps": 0, "amp": "bf16", "device": "cpu"}


@pytest.mark.parametrize("change, why", [
    ({"allocated_bytes": -5}, "allocated_bytes is -5, negative"),
    ({"step_ms": float("nan")}, "step_ms is nan, not finite"),
    ({"tokens_per_s": float("inf")}, "tokens_per_s is inf, not finite"),
    ({"reserved_bytes": "8192"}, "reserved_bytes is str, not int"),
    ({"reserved_bytes": 8192.0}, "reserved_bytes is float, not int"),
    ({"skipped_steps": True}, "skipped_steps is bool, not int"),
    ({"step_ms": None}, "step_ms is null"),
    ({"grad_norm": -1.0}, "grad_norm is -1.0, negative"),
    ({"gpu_util_pct": "busy"}, "gpu_util_pct is str, not a number"),
])
def test_a_broken_value_makes_a_bad_row(change, why):
    row = {**GOOD, **change}
    assert step_row_problem(row) == why
    with pytest.raises(ValueError, match=why.split(" is ")[0]):
        StepSample.from_json(row)


def test_what_the_schema_allows():
    assert step_row_problem(GOOD) is None
    assert StepSample.from_json({**GOOD, "loss": -3.5}).loss == -3.5  # a loop's own loss
    assert StepSample.from_json({**GOOD, "future_field": -1}).step == 3  # not in the schema
    older = {k: v for k, v in GOOD.items() if k != "host_rss_bytes"}  # an older memtop
    assert StepSample.from_json(older).host_rss_bytes is None
    assert StepSample.from_json({**GOOD, "loss": None}).loss is None  # n/a is allowed


def _lines(rows: list[dict]) -> bytes:
    # json.dumps writes NaN / Infinity, as a hand-edited or foreign file may hold them
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def test_every_reader_counts_broken_rows_as_bad_lines(tmp_path):
    rows = [{**GOOD, "step": 1}, {**GOOD, "step": 2, "allocated_bytes": -1},
            {**GOOD, "step": 3, "step_ms": float("inf")}, {**GOOD, "step": 4},
            {**GOOD, "step": 5, "driver_used_bytes": "lots"},
            {"event": "run_finished", "step": 5, "time_s": 1.0, "reason": "finished"}]
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(_lines(rows))
    read = read_rows(path)
    assert read.bad == 3 and [r["step"] for r in read.steps] == [1, 4]
    assert read.first_bad == "line 2: allocated_bytes is -1, negative"
    follower = Follower(path)
    assert [r["step"] for r in follower.poll() if "event" not in r] == [1, 4]
    assert follower.bad == 3
    follower.close()
    hist = read_history(path, keep_last=10)
    assert hist.bad == 3 and [r["step"] for r in hist.rows if "event" not in r] == [1, 4]


def test_the_report_says_how_many_rows_it_skipped_and_why(tmp_path, capsys):
    from tui.cli import main as cli_main

    extra = [{"step": 6, "time_s": 0.6, "step_ms": 100.0, "allocated_bytes": -4096,
              "skipped_steps": 0},
             {"step": 7, "time_s": 0.7, "step_ms": float("nan"), "skipped_steps": 0}]
    run_dir = write_junk_run(tmp_path, {}, extra)
    assert cli_main(["report", str(run_dir)]) == 0, capsys.readouterr().err
    report = json.loads((run_dir / "report.json").read_text())
    assert report["rows"]["steps"] == 5 and report["rows"]["unreadable"] == 2
    assert not report["complete"]
    text = (run_dir / "report.md").read_text()
    assert "2 bad line(s) in metrics.jsonl were skipped" in text
    assert "allocated_bytes is -4096, negative" in text


@pytest.mark.parametrize("kind", sorted(R.EVENT_KINDS))
def test_an_event_without_its_fields_never_reads_none(kind):
    text = Event(kind, 4, 0.0, {}).summary()
    assert "None" not in text
    if R.EVENT_KINDS[kind].required:
        assert text.startswith("incomplete event (no ")
    nulls = {name: None for name in R.EVENT_KINDS[kind].fields}
    assert "None" not in Event(kind, 4, 0.0, nulls).summary()


def test_a_wrongly_typed_field_is_dropped_and_the_event_is_incomplete():
    row = {"event": "leak_suspected", "step": 9, "time_s": 1.0, "counter": "host_heap",
           "bytes_per_step": "fast", "since_step": [2]}
    event = Event.from_json(row)
    assert event.summary() == "incomplete event (no bytes_per_step, since_step)"
    # an event that carries its own error is complete: the error is what it says
    assert Event(R.WEIGHTS_SAVED, 5, 0.0, {"error": "disk full"}).summary() == \
        "weights not saved: disk full"


def test_incomplete_leak_rows_in_the_report_and_the_dashboard(tmp_path, capsys):
    from tui.cli import main as cli_main
    from tui.format_panels import leak_alert_line

    leak = {"event": "leak_suspected", "step": 4, "time_s": 0.4, "bytes_per_step": 512}
    run_dir = write_junk_run(tmp_path, {}, [leak])
    assert cli_main(["report", str(run_dir)]) == 0, capsys.readouterr().err
    text = (run_dir / "report.md").read_text()
    assert "incomplete event (no counter, since_step)" in text
    assert "None" not in text
    assert leak_alert_line({"bytes_per_step": 512}, 4) == (
        "leak suspected at step 4: incomplete event (no counter, since_step)")
