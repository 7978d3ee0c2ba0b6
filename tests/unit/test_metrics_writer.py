"""The batched metrics writer (issue 28): order, what close and exit keep, what kill -9 loses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from probes import records as R
from probes.records import Event
from probes.runfolder import MetricsWriter, RunRecorder, read_metrics
from tests.factories import make_sample, wait_until

ROOT = Path(__file__).resolve().parents[2]


def _steps_and_events(path: Path) -> list[str]:
    return [f"e:{r['event']}" if "event" in r else f"s:{r['step']}"
            for r in map(json.loads, path.read_text().splitlines())]


@pytest.mark.parametrize("encode_in_thread", [False, True])  # CPU runs, CUDA runs
def test_rows_wait_for_the_flush_in_order_and_events_flush_everything_before_them(
        tmp_path, encode_in_thread):
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path, flush_interval_s=3600,  # only events and close() flush here
                           encode_in_thread=encode_in_thread)
    writer.write(Event(R.RUN_STARTED, 0, 0.0, {"amp": "off"}))
    assert _steps_and_events(path) == ["e:run_started"]  # urgent: on disk at once
    writer.write(make_sample(1))
    writer.write(Event(R.LEDGER, 1, 0.1, {"lines": {}}))  # periodic: waits, in its place
    writer.write(make_sample(2))
    assert _steps_and_events(path) == ["e:run_started"]
    writer.write(Event(R.PROFILE_STARTED, 2, 0.2, {}))  # what a live reader waits for
    assert _steps_and_events(path) == ["e:run_started", "s:1", "e:ledger", "s:2",
                                       "e:profile_started"]
    writer.write(make_sample(3))
    writer.write(Event(R.RUN_FINISHED, 3, 0.3, {"reason": "finished"}))
    assert _steps_and_events(path)[-2:] == ["s:3", "e:run_finished"]
    assert writer.flushed_step == 3
    writer.close()


def test_close_writes_what_is_pending_and_a_zero_interval_writes_each_row(tmp_path):
    batched = MetricsWriter(tmp_path / "a.jsonl", flush_interval_s=3600)
    for step in range(1, 6):
        batched.write(make_sample(step))
    assert (tmp_path / "a.jsonl").read_text() == ""
    batched.close()
    assert _steps_and_events(tmp_path / "a.jsonl") == [f"s:{i}" for i in range(1, 6)]
    direct = MetricsWriter(tmp_path / "b.jsonl", flush_interval_s=0)
    direct.write(make_sample(1))
    assert _steps_and_events(tmp_path / "b.jsonl") == ["s:1"]
    direct.close()
    with pytest.raises(ValueError, match="flush_interval_s"):
        MetricsWriter(tmp_path / "c.jsonl", flush_interval_s=-1)


def test_the_background_thread_flushes_rows_when_no_more_come(tmp_path):
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path, flush_interval_s=0.05)
    writer.write(make_sample(1))  # nothing else is written: only the flusher can put it there
    wait_until(lambda: writer.flushed_step >= 1, "the flusher's write")
    assert _steps_and_events(path) == ["s:1"]
    writer.close()


def test_the_writers_thread_encodes_queued_rows_and_a_full_queue_is_encoded_at_once(tmp_path):
    """Issue 28: a step row costs its publisher a queue append; the writer's thread encodes it
    (not on disk before the interval), and a queue that fills is encoded by the publisher."""
    from probes.runfolder.writer import MAX_QUEUED_ROWS

    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path, flush_interval_s=3600, encode_in_thread=True)  # CUDA runs
    writer.write(make_sample(1))
    assert writer.queued_rows == 1
    wait_until(lambda: writer.queued_rows == 0, "the writer's thread to encode the row")
    assert writer.queued_rows == 0 and path.read_text() == ""  # encoded, waiting in the buffer
    queue_lengths = []  # however fast rows come, the queue stays bounded
    for step in range(2, 2 + 3 * MAX_QUEUED_ROWS):
        writer.write(make_sample(step))
        queue_lengths.append(writer.queued_rows)
    assert max(queue_lengths) <= MAX_QUEUED_ROWS
    writer.close()
    assert _steps_and_events(path) == [f"s:{i}" for i in range(1, 2 + 3 * MAX_QUEUED_ROWS)]


def test_the_writers_thread_ends_with_the_last_writer_and_starts_again_for_a_new_one(tmp_path):
    """A thread left waiting at interpreter exit made a torchrun+gloo rank abort in torch's
    teardown (tests/integration/test_ranks_split.py): the last writer's close joins it."""
    from probes.runfolder.writer import _Flusher

    flusher = _Flusher()  # its own, so other tests' open writers do not keep it alive
    first = MetricsWriter(tmp_path / "a.jsonl", flush_interval_s=3600)
    flusher.add(first)
    thread = flusher._thread
    assert thread is not None and thread.is_alive()
    flusher.discard(first)  # the last one: the thread ends before this returns
    assert not thread.is_alive() and flusher._thread is None
    second = MetricsWriter(tmp_path / "b.jsonl", flush_interval_s=3600, encode_in_thread=True)
    flusher.add(second)
    second.write(make_sample(1))
    wait_until(lambda: second.queued_rows == 0, "the new thread to encode the row")
    assert second.queued_rows == 0 and flusher._thread is not thread
    flusher.discard(second)
    first.close()
    second.close()
    assert _steps_and_events(tmp_path / "b.jsonl") == ["s:1"]


def test_cpu_rows_are_encoded_by_their_publisher_and_cuda_runs_hand_them_to_the_thread(
        tmp_path):
    """On CPU the writer's thread never holds a row (its malloc cache would show in the heap
    counter: probes/runfolder/writer.py); RunSession.open switches CUDA runs over."""
    rec = RunRecorder(tmp_path, config={})
    writer = rec._writer
    assert writer is not None and not writer.encode_in_thread
    rec.publish(make_sample(1))
    assert writer.queued_rows == 0  # encoded at once, into the buffer
    rec.encode_rows_in_thread()
    assert writer.encode_in_thread
    rec.close()


def test_a_recorder_flush_makes_the_rows_readable_mid_run(tmp_path):
    rec = RunRecorder(tmp_path, config={})
    rec.publish(make_sample(1))
    rec.flush()
    steps, _events, bad = read_metrics(rec.metrics_path)
    assert [s["step"] for s in steps] == [1] and bad == 0
    rec.close()


def test_a_ranks_recorder_writes_its_rank_on_every_event(tmp_path):
    """issue 30: an instrument builds its Event without a rank (profiler window, ledger, leak
    watch), so rank 1's window read back as rank 0's: beside rank 0's panes, unsaid."""
    from probes.records import Event

    seen = []
    rec = RunRecorder(tmp_path, rank=1, sinks=[seen.append])
    rec.publish(Event("profile_done", 9, 1.0, {"dir": "profiles/step-5/rank-1", "top_ops": []}))
    rec.emit("hint", 9, {"kind": "x", "message": "y"})
    rec.close()
    _steps, events, bad = read_metrics(rec.metrics_path)
    assert bad == 0 and [e["event"] for e in events][:2] == ["profile_done", "hint"]
    assert all(e.get("rank") == 1 for e in events)
    assert [r.rank for r in seen] == [1] * len(seen)


CHILD = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {root!r})
    from probes.runfolder import MetricsWriter
    from tests.factories import make_sample, wait_until
    writer = MetricsWriter({path!r}, flush_interval_s={interval!r})
    step = 0
    while True:
        step += 1
        writer.write(make_sample(step, time_s=time.monotonic()))
        os.write(1, b"%d\\n" % step)  # what was published, unbuffered
        time.sleep(0.001)
""")


@pytest.mark.parametrize("exit_kind", ["kill -9", "exception"])
def test_what_a_killed_or_failed_process_leaves(tmp_path, exit_kind):
    """kill -9: the file holds complete lines, steps 1..n in order, and loses only the rows
    published after its last flush; an exception (interpreter exit): nothing is lost."""
    path = tmp_path / "metrics.jsonl"
    code = CHILD.format(root=str(ROOT), path=str(path), interval=0.2)
    if exit_kind == "exception":
        code = code.replace("while True:", "for _ in range(300):") + "raise RuntimeError('x')\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, cwd=ROOT)
    assert proc.stdout is not None
    published = 0
    if exit_kind == "kill -9":
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until a flush by time has put rows on disk
            line = proc.stdout.readline()
            published = int(line) if line.strip() else published
            if path.exists() and path.stat().st_size > 0 and published > 50:
                break
        os.kill(proc.pid, signal.SIGKILL)
    rest = proc.stdout.read()
    proc.wait(timeout=60)
    published = max([published, *(int(x) for x in rest.split())])
    steps, events, bad = read_metrics(path)
    numbers = [s["step"] for s in steps]
    assert bad == 0 and events == []  # every line complete
    assert numbers == list(range(1, len(numbers) + 1))  # a prefix, in order
    if exit_kind == "exception":
        assert proc.returncode == 1 and numbers[-1] == published == 300
    else:
        assert proc.returncode == -signal.SIGKILL and 0 < len(numbers) <= published
