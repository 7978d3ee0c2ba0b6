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


def test_follower_reads_on_from_the_start_of_a_file_cut_back_in_place(tmp_path):
    """logrotate's copytruncate or `: > metrics.jsonl`: the same file, shorter than what was
    read. The follower goes on from its new start instead of waiting for it to pass the old
    offset (and then reading from mid-file); the viewer says so."""
    from probes.runfolder import Follower
    from tui.sources import FolderSource

    path = tmp_path / METRICS
    path.write_bytes(record_line(started_event()) + b"".join(
        record_line(make_sample(s)) for s in range(1, 6)))
    follower = Follower(path)
    assert [r.get("step") for r in follower.poll()] == [0, 1, 2, 3, 4, 5]
    with open(path, "r+b") as fh:  # cut back in place: same inode
        fh.truncate(0)
    with open(path, "ab") as fh:
        fh.write(record_line(make_sample(6)) + record_line(make_sample(7)))
    assert [r["step"] for r in follower.poll()] == [6, 7]
    assert follower.truncations == 1 and not follower.gone and follower.bad == 0

    (tmp_path / "config.json").write_text("{}")
    source = FolderSource(tmp_path)
    source.start()
    with open(path, "r+b") as fh:
        fh.truncate(0)
    source.poll()
    assert "cut back in place" in source.note


def test_follower_drops_a_line_that_never_ends(tmp_path):
    """A writer that never ends its line must not grow the viewer's buffer without bound: past
    MAX_LINE_BYTES the line is counted as bad and skipped to its end."""
    from probes.runfolder import Follower

    path = tmp_path / METRICS
    path.write_bytes(record_line(make_sample(1)))
    follower = Follower(path)
    follower.MAX_LINE_BYTES = 4096
    assert [r["step"] for r in follower.poll()] == [1]
    with open(path, "ab") as fh:
        for _ in range(10):
            fh.write(b"x" * 2000)
            fh.flush()
            assert follower.poll() == []
            assert follower.buffered_bytes <= 4096 + 2000
    with open(path, "ab") as fh:
        fh.write(b"tail of the long line\n" + record_line(make_sample(2)))
    assert [r["step"] for r in follower.poll()] == [2]
    assert follower.bad == 1 and not follower.waiting_for_newline
