"""The run folder read back in this process: the fast history of a long finished run (events,
the tail, a thinned chart) and a CUDA run's config on a CPU-only machine (a follower over a file
another process writes, and `memtop runs`: tests/integration/test_runfolder.py)."""

from __future__ import annotations

import json

from factories import make_sample, record_line, started_event

from probes import records as R
from probes.records import Event
from probes.runfolder import METRICS, read_history
from probes.runfolder.state import RunState


def test_history_of_a_long_run_keeps_events_tail_and_a_thinned_chart(tmp_path):
    path = tmp_path / METRICS
    with open(path, "wb") as fh:
        fh.write(record_line(started_event()))
        for step in range(1, 5001):
            fh.write(record_line(make_sample(step)))
            if step == 4995:
                fh.write(b"junk\n")  # within the tail: parsed, counted, skipped
            if step == 2500:
                fh.write(record_line(Event(R.LEAK_SUSPECTED, step, 1.0, {"counter": "host_heap"})))
        fh.write(record_line(Event(R.RUN_FINISHED, 5000, 500.0, {"reason": "finished"})))
        fh.write(record_line(make_sample(5001))[:30])  # a torn tail is left for the follower
    hist = read_history(path, keep_last=10, chart_points=100)
    events = [r["event"] for r in hist.rows if "event" in r]
    assert events == ["run_started", "leak_suspected", "run_finished"]
    # the tail's 10 lines, one of them junk
    assert [r["step"] for r in hist.rows if "event" not in r] == list(range(4992, 5001))
    assert 90 <= len(hist.chart_steps) <= 110 and hist.chart_steps[0]["step"] == 1
    assert hist.steps_total == 5001 and hist.bad == 1  # non-event lines, the junk one included
    assert hist.end == path.stat().st_size - 30
    state = RunState()
    for row in hist.rows:
        state.apply(R.record_from_json(row))
    assert state.finished and state.step == 5000 and state.outcome == "finished"
    assert "host_heap" in state.alerts


def test_config_json_loads_without_resolving_the_device(tmp_path):
    """A CUDA run's config reads on a CPU-only machine: the device resolves only at run start."""
    from trainer.config import TrainConfig

    cfg = TrainConfig(device="cuda:1", amp="fp16", run_dir=str(tmp_path))
    back = TrainConfig.from_json(json.loads(json.dumps(cfg.to_json())))
    assert back.device == "cuda:1" and back.amp == "fp16"
