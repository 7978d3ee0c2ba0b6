"""RunRecorder.publish_soon (issue 28): a step row waits a few steps at most, in order, for its
thread to publish it in a batch; events, flush, seal and close never overtake it; the Monitor's
batched instruments see every step, before the next event and before they close."""

from __future__ import annotations

import json
import threading

import torch

from probes import Monitor
from probes import records as R
from probes.instruments.hooks import StepHook
from probes.runfolder import RunRecorder
from probes.runfolder.recorder import MAX_SOON_ROWS
from tests.factories import make_sample


def _order(path) -> list[str]:
    return [f"e:{r['event']}" if "event" in r else f"s:{r['step']}"
            for r in map(json.loads, path.read_text().splitlines())]


def test_rows_wait_at_most_a_batch_and_an_event_publishes_them_first(tmp_path):
    seen: list[tuple[int, object]] = []
    rec = RunRecorder(tmp_path)
    rec.on_row = lambda sample, extra: seen.append((sample.step, extra))
    rec._drained_at = float("inf")  # only the batch's size drains in this test, never the clock
    for step in range(1, MAX_SOON_ROWS):
        rec.publish_soon(make_sample(step), extra=step * 10)
    assert rec.rows_waiting == MAX_SOON_ROWS - 1 and seen == []
    assert rec.state.last_sample is None  # not published yet
    rec.publish_soon(make_sample(MAX_SOON_ROWS), extra=0)  # the batch is full: all published
    assert rec.rows_waiting == 0 and [s for s, _ in seen] == list(range(1, MAX_SOON_ROWS + 1))
    assert seen[0] == (1, 10)
    rec.publish_soon(make_sample(MAX_SOON_ROWS + 1))
    rec.emit(R.PROFILE_STARTED, MAX_SOON_ROWS + 1)  # an event: the row before it goes first
    rec.flush()
    assert _order(rec.metrics_path)[-2:] == [f"s:{MAX_SOON_ROWS + 1}", "e:profile_started"]
    rec.close()


def test_another_thread_never_drains_and_seal_writes_the_waiting_rows(tmp_path):
    rec = RunRecorder(tmp_path)
    ran_on: list[int] = []
    rec.on_row = lambda sample, extra: ran_on.append(threading.get_ident())
    rec._drained_at = float("inf")
    rec.publish_soon(make_sample(1))
    rec.publish_soon(make_sample(2))
    other = threading.Thread(target=rec.drain)
    other.start()
    other.join(timeout=10)
    assert rec.rows_waiting == 2 and ran_on == []  # the instruments stay on the loop's thread
    sealer = threading.Thread(target=rec.seal, args=("terminal lost", 2))
    sealer.start()
    sealer.join(timeout=10)
    assert _order(rec.metrics_path) == ["s:1", "s:2", "e:run_finished"]


class _Batched(StepHook):
    batched = True

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.output_bytes: set[int | None] = set()
        self.closed_after: list[int] | None = None

    def end_step(self, step, tensors, sample):
        assert tensors.output is None and tensors.loss is None  # no tensor is held for later
        self.steps.append(step)
        self.output_bytes.add(tensors.output_bytes)

    def between_steps(self, kind):
        self.steps.append(-1)

    def close(self):
        self.closed_after = list(self.steps)


def test_a_batched_instrument_sees_every_step_before_events_and_before_it_closes(tmp_path):
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = _Batched()
    mon = Monitor(model, opt, run_dir=tmp_path, listen=False, write_report=False,
                  extra_hooks=[hook], warmup_steps=0)
    x = torch.randn(4, 4)
    for step in range(1, 6):
        with mon.step() as s:
            out = model(x)
            out.sum().backward()
            opt.step()
            opt.zero_grad()
            s.set(loss=out.sum(), output=out)
        if step == 3:
            mon.between_steps(R.EVALUATE)  # the rows of steps 1-3 and their hook calls first
    assert mon.state.last_sample.step == 5  # read on the loop's thread: every row is in it
    mon.close()
    assert hook.steps == [1, 2, 3, -1, 4, 5] and hook.closed_after == hook.steps
    assert hook.output_bytes == {4 * 4 * 4}  # the output's size, measured at its step


def test_a_run_ended_from_another_thread_keeps_every_waiting_row(tmp_path):
    """A Monitor closed by another thread (HF's next train() closing a run that raised): its
    run_finished comes after every row the loop had finished; close() writes what is left."""
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    ended, closed = RunRecorder(tmp_path / "a"), RunRecorder(tmp_path / "b")
    for rec in (ended, closed):
        rec._drained_at = float("inf")
        rec.publish_soon(make_sample(1))
        rec.publish_soon(make_sample(2))
    other = threading.Thread(target=lambda: (ended.emit(R.RUN_FINISHED, 2, {"reason": "x"}),
                                             closed.close()))
    other.start()
    other.join(timeout=10)
    assert _order(ended.metrics_path) == ["s:1", "s:2", "e:run_finished"]
    assert _order(closed.metrics_path) == ["s:1", "s:2"] and closed.state.last_sample.step == 2
    ended.close()
