"""The leak watch's DataLoader workers series (probes/instruments/workerwatch.py) driven by hand
with readings shaped like the ones real workers gave (tests/integration/test_workers.py has the
real ones): when it starts, what it alerts on and what not, what the alert says, and when it
clears."""

from __future__ import annotations

from factories import make_sample, run_context

from probes import records as R
from probes.counters.workers import ChildMemory, WorkersReading
from probes.instruments.hooks import StepTensors
from probes.instruments.leakcause import workers_cause
from probes.instruments.leakwatch import LeakWatch
from probes.records import Event

KiB, MiB = 1024, 1024 * 1024
START = 20 * MiB  # a forked worker's own pages after its first batches


def reading(seq: int, uss: list[int], generation: int = 1) -> WorkersReading:
    children = tuple(ChildMemory(100 + i, "pt_data_worker", u + 150 * MiB, u + 40 * MiB, u,
                                 START, float(seq)) for i, u in enumerate(uss))
    total = sum(uss)
    return WorkersReading(seq, float(seq), generation, children, total + 150 * MiB * len(uss),
                          total + 40 * MiB * len(uss), total,
                          {"workers": len(uss), "workers_uss_bytes": total})


class Loop:
    """A LeakWatch fed one step at a time: the trainer's heap flat unless told, a workers'
    reading on the steps given one."""

    def __init__(self, tmp_path, warmup: int = 5) -> None:
        self.events: list[Event] = []
        self.watch = LeakWatch()
        self.watch.setup(run_context(tmp_path, warmup_steps=warmup, emit=self.events.append,
                                     workers=object()))
        self.seq = 0

    def step(self, step: int, uss: list[int] | None = None, generation: int = 1,
             heap: int = 100 * MiB, **row) -> None:
        fresh = None
        if uss is not None:
            self.seq += 1
            fresh = reading(self.seq, uss, generation)
        sample = make_sample(step, time_s=0.1 * step, step_ms=50.0, allocated_bytes=heap,
                             host_rss_bytes=400 * MiB, workers=len(uss or []) or None,
                             workers_uss_bytes=sum(uss) if uss else None, **row)
        self.watch.end_step(step, StepTensors(None, None, workers=fresh), sample)

    def named(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.event == kind]


def test_a_leak_in_every_worker_from_their_start_is_alerted_and_named(tmp_path):
    loop = Loop(tmp_path)
    for step in range(1, 15):  # 2 workers, each +4 MiB a step (a batch of 512 KiB items)
        loop.step(step, [START + 4 * MiB * step] * 2)
    (alert,) = loop.named(R.LEAK_SUSPECTED)
    assert alert.step <= 7  # 3 readings settle, then 4 points: warmup is the trainer's only
    data = alert.data
    assert data["counter"] == R.WORKERS_COUNTER and data["bytes_per_step"] == 8 * MiB
    assert data["workers"] == 2 and data["trainer_flat"] is True
    assert data["pattern"] == "equal, from the start"
    assert data["likely_cause"] == "dataset cache or copy-on-read"
    assert alert.summary().startswith("DataLoader workers: +8.0 MiB/step between 2 workers, "
                                      "the trainer flat")
    assert data["fill_counter"] == "host RSS + workers' USS"
    assert loop.watch.alerts[R.WORKERS_COUNTER]["counter"] == R.WORKERS_COUNTER


def test_the_trainer_growing_beside_them_is_said(tmp_path):
    loop = Loop(tmp_path, warmup=0)
    for step in range(1, 15):
        loop.step(step, [START + 4 * MiB * step] * 2, heap=100 * MiB + 300 * KiB * step)
    alert = next(e for e in loop.named(R.LEAK_SUSPECTED)
                 if e.data["counter"] == R.WORKERS_COUNTER)
    assert alert.data["trainer_flat"] is False
    assert "the trainer +300 KiB/step too" in alert.summary()


def test_healthy_workers_start_up_and_slow_tail_raise_nothing(tmp_path):
    loop = Loop(tmp_path)
    uss = START - 8 * MiB
    for step in range(1, 400):
        if step <= 4:
            uss += 2 * MiB  # the first batches: collate buffers, arenas
        else:
            # copy-on-write of what reads touch, slowing: ~20 KB/step between two forked
            # workers at first in the real runs (one batch a step, whatever the workers)
            uss += max(0, 16 - step // 20) * KiB
        if step == 200:
            uss += 30 * MiB  # a gen-2 collection in the worker copies the pages it walks, once
        loop.step(step, [uss, uss] if step % 3 == 0 or step < 6 else None)
    assert loop.named(R.LEAK_SUSPECTED) == []
    assert loop.watch.workers.detector._seen > 100  # it was fed all along


def test_new_workers_start_a_new_series_and_a_lone_grower_is_named(tmp_path):
    loop = Loop(tmp_path)
    for step in range(1, 10):  # an epoch of healthy workers, then new ones
        loop.step(step, [START, START])
    for step in range(10, 30):  # the new set: only worker 100 grows
        loop.step(step, [START + 6 * MiB * (step - 9), START], generation=2)
    (alert,) = loop.named(R.LEAK_SUSPECTED)
    assert alert.step >= 10 + 2 + 3  # not compared across the change: settle, then points
    assert alert.data["pattern"] == "unequal"
    assert "mostly worker 100" in alert.data["hint"]


def test_workers_that_end_clear_their_alert_and_the_trainer_keeps_its_series(tmp_path):
    loop = Loop(tmp_path)
    for step in range(1, 12):
        loop.step(step, [START + 4 * MiB * step] * 2)
    assert loop.named(R.LEAK_SUSPECTED)
    trainer = loop.watch.detectors["host_heap" if "host_heap" in loop.watch.detectors
                                   else "host_rss"]
    seen = trainer._seen
    loop.step(12, [], generation=2)  # the loader is done: no workers
    (cleared,) = loop.named(R.LEAK_CLEARED)
    assert cleared.data["counter"] == R.WORKERS_COUNTER
    assert R.WORKERS_COUNTER not in loop.watch.alerts
    assert trainer._seen == seen + 1  # the trainer's series went on through it


def test_the_workers_are_fed_on_warmup_and_disturbed_steps(tmp_path):
    loop = Loop(tmp_path, warmup=50)
    for step in range(1, 15):
        loop.step(step, [START + 4 * MiB * step] * 2,
                  disturbed="look" if step % 2 else None)
    (alert,) = loop.named(R.LEAK_SUSPECTED)
    assert alert.data["counter"] == R.WORKERS_COUNTER  # other processes: not disturbed


def test_workers_cause_without_a_reading_still_gives_the_fix():
    cause, pattern, hint = workers_cause(MiB, None, True)
    assert pattern == "unknown" and "numpy arrays" in hint
