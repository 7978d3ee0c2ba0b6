"""DataLoader workers, real ones (num_workers 2 or 4, fork and spawn): the sampler thread reads
them from /proc (probes/counters/workers.py), every row records its latest reading, the leak
watch alerts on a worker leak and names it, a healthy loader raises nothing, PSS does not count
a shared tensor once per worker, a dead worker is noted, and the guard counts the tree.

Loops are tiny (a Linear on 8 features) under probes.Monitor, on a background thread as memtop's
trainer runs. A paced loop waits for the sampler's next reading before each step (a condition
with a timeout, never a sleep): a step then sees one new reading, as a real step of a second
would, so "within 10 steps" means the same on a loaded machine.
"""

from __future__ import annotations

import gc
import os
import signal

import pytest
import torch
from factories import events_named, in_thread, metrics_rows
from loader_data import BATCH, LEAK_BYTES, Items, tiny_model, touch_shared, train_step
from torch.utils.data import DataLoader

from probes import Monitor
from probes import records as R
from probes.control.requests import Request
from probes.counters.fill import TREE_COUNTER

READING_TIMEOUT_S = 60.0  # a spawn worker imports torch first: seconds on a loaded machine
MiB = 1024 * 1024


def run_loop(tmp_path, dataset, *, steps, context="fork", workers=2, persistent=True,
             paced=False, pace_every=1, period_s=0.2, on_step=None, worker_init_fn=None,
             **monitor):
    """Train ``steps`` steps on batches of ``dataset``; returns (run folder, the Monitor).
    ``paced``: every ``pace_every``-th step first waits for the sampler's next reading."""
    def loop():
        model, opt = tiny_model()
        loader = DataLoader(dataset, batch_size=BATCH, num_workers=workers,
                            persistent_workers=persistent, multiprocessing_context=context,
                            worker_init_fn=worker_init_fn)
        options = dict(run_dir=tmp_path, workers_sample_s=period_s, listen=False,
                       profiler=False, write_report=False)
        options.update(monitor)
        with Monitor(model, opt, **options) as mon:
            batches = iter(loader)
            seq = 0
            for step in range(1, steps + 1):
                if paced and step % pace_every == 0:
                    reading = mon.session.workers.wait_for_reading(seq, READING_TIMEOUT_S)
                    assert reading is not None, "the workers' sampler took no reading"
                    seq = reading.seq
                try:
                    x, y = next(batches)
                except StopIteration:  # an epoch ended: without persistent_workers, new ones
                    batches = iter(loader)
                    x, y = next(batches)
                with mon.step() as scope:
                    scope.set(loss=train_step(model, opt, x, y))
                if on_step is not None:
                    on_step(mon, step)
                if mon.should_stop:
                    break
            del batches
        return mon

    # the loader and its iterator (persistent workers) go now, not at some later collection:
    # the next test's process then has no workers but its own
    mon = in_thread(loop)
    gc.collect()
    return mon.run_dir, mon


def first_step_with_workers(steps):
    return next(r["step"] for r in steps if r.get("workers"))


# ---- a leak in the workers --------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_worker_leak_is_alerted_within_10_steps_and_named_as_the_workers(tmp_path, context):
    run, _ = run_loop(tmp_path, Items(leak_bytes=LEAK_BYTES), steps=14, context=context,
                      paced=True)
    steps, events = metrics_rows(run)
    start = first_step_with_workers(steps)  # the sampler's first reading of the workers
    alerts = events_named(run, R.LEAK_SUSPECTED)
    assert [a["counter"] for a in alerts] == [R.WORKERS_COUNTER], alerts  # theirs, only
    alert = alerts[0]
    assert alert["step"] - start <= 10, (alert["step"], start)
    # 16 items of 512 KiB a step, kept by whichever worker made the batch
    assert 0.75 * BATCH * LEAK_BYTES <= alert["bytes_per_step"] <= 1.25 * BATCH * LEAK_BYTES
    assert alert["workers"] == 2 and alert["trainer_flat"] is True
    assert alert["likely_cause"] == "dataset cache or copy-on-read"
    assert "numpy arrays, torch tensors or Arrow" in alert["hint"]
    line = R.Event.from_json(alert).summary()
    assert line.startswith("DataLoader workers: +") and "between 2 workers, the trainer flat" in \
        line, line
    assert alert["fill_counter"] == TREE_COUNTER  # the box fills with the trainer and workers
    # w's answer comes at once, from /proc, and says what it cannot do
    (culprit,) = events_named(run, R.LEAK_CULPRIT)
    assert culprit["culprits"][0]["kind"] == "workers" and culprit["culprits"][0]["count"] == 2
    assert "cannot walk a worker's objects" in R.Event.from_json(culprit).summary()
    assert not events_named(run, R.LEAK_LOOK)  # no look at the trainer's objects: not theirs
    assert all(r.get("disturbed") is None for r in steps)  # nothing of the trainer's disturbed
    # the rows: every one from the first reading on has the workers, growing
    counted = [r for r in steps if r["step"] >= start]
    assert all(r["workers"] == 2 for r in counted)
    assert counted[-1]["workers_uss_bytes"] - counted[0]["workers_uss_bytes"] > 40 * MiB
    assert all(r["workers_pss_bytes"] <= r["workers_rss_bytes"] for r in counted)
    started = events_named(run, R.WORKERS)[0]
    # a fork worker renames itself; a spawned one is the interpreter (python, python3, python3.11)
    assert all(c["comm"] == "pt_data_worker" or c["comm"].startswith("python")
               for c in started["started"]), started["started"]


# ---- healthy loaders: no alert ----------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("context,persistent,n", [
    ("fork", True, 1_000_000),  # steady prefetch
    ("fork", False, 100 * BATCH),  # new workers every 100 steps (an epoch each)
    ("spawn", True, 1_000_000),
])
def test_a_healthy_loader_with_workers_raises_no_alert(tmp_path, context, persistent, n):
    # a reading every 5th step at least: ~120 points for the detector over the 600 steps
    run, mon = run_loop(tmp_path, Items(n=n), steps=600, context=context,
                        persistent=persistent, period_s=0.05, paced=True, pace_every=5)
    steps, events = metrics_rows(run)
    assert events_named(run, R.LEAK_SUSPECTED) == []
    assert events_named(run, R.WORKER_DIED) == []
    with_workers = [r for r in steps if r.get("workers")]
    assert len({r["workers_uss_bytes"] for r in with_workers}) >= 20  # readings were fed
    from probes.instruments.leakwatch import LeakWatch

    watch = next(h for h in mon.hooks if isinstance(h, LeakWatch))
    series = watch.workers  # the leak watch's workers series saw them
    assert series is not None and series.detector._seen >= (60 if persistent else 40)
    lines = [ln for e in events_named(run, R.LEDGER) for ln in e["lines"]
             if ln["name"] == "DataLoader workers"]
    assert lines and all(ln["measured_bytes"] > 0 for ln in lines)  # the ledger's line
    changes = events_named(run, R.WORKERS)
    if not persistent:  # each epoch's workers started and ended, and were said to
        assert sum(len(e.get("ended", [])) for e in changes) >= 2 * (600 // 100 - 1)
        assert all(c.get("exit") in (None, "exit 0") for e in changes for c in e.get("ended", []))


# ---- PSS: a shared tensor counted once --------------------------------------------------------
def test_pss_does_not_count_a_tensor_the_workers_share_once_per_worker(tmp_path):
    size = 128 * MiB
    shared = torch.ones(size // 4)  # the trainer's, read by every forked worker, never written
    dataset = Items(shared=shared)

    def last_reading(mon, step):
        if step == 8:  # all four have read the whole tensor (worker_init_fn) and made a batch
            mon.test_reading = mon.session.workers.wait_for_reading(
                mon.session.workers.latest.seq, READING_TIMEOUT_S)

    run, mon = run_loop(tmp_path, dataset, steps=9, workers=4, on_step=last_reading,
                        worker_init_fn=touch_shared)
    reading = mon.test_reading
    assert reading.workers == 4
    assert all(c.rss_bytes >= size for c in reading.children)  # each maps the whole tensor
    assert reading.rss_bytes >= 4 * size  # RSS: the tensor four times over
    assert reading.pss_bytes <= reading.rss_bytes - 3 * size  # PSS: 4/5 of it, split 5 ways
    assert reading.uss_bytes <= reading.rss_bytes - 4 * size  # USS: in no worker's own pages
    steps, _ = metrics_rows(run)
    last = steps[-1]
    assert last["workers"] == 4 and last["workers_pss_bytes"] == reading.pss_bytes
    assert last["host_rss_bytes"] >= size  # the trainer holds it whole
    assert events_named(run, R.LEAK_SUSPECTED) == []


# ---- a worker that dies -----------------------------------------------------------------------
def test_a_worker_that_dies_mid_run_is_noted_not_crashed_on(tmp_path):
    killed = {}

    def kill_one(mon, step):
        sampler = mon.session.workers
        if step == 3:
            reading = sampler.wait_for_reading(sampler.latest.seq, READING_TIMEOUT_S)
            assert reading.workers == 2
            killed["pid"] = reading.children[0].pid
            os.kill(killed["pid"], signal.SIGKILL)
            # the next reading no longer counts it (a zombie until the loader reaps it)
            reading = sampler.wait_for_reading(reading.seq, READING_TIMEOUT_S)
            while reading.workers != 1:
                reading = sampler.wait_for_reading(reading.seq, READING_TIMEOUT_S)

    def loop_on_one_batch(mon, step):
        kill_one(mon, step)

    # steps after the kill reuse no loader batch from the dead worker: the loader itself would
    # raise "DataLoader worker exited unexpectedly" (torch's behaviour, not memtop's)
    run, mon = run_loop(tmp_path, Items(), steps=3, on_step=loop_on_one_batch)
    steps, events = metrics_rows(run)
    assert mon.session.workers.error is None  # the sampler read on, unharmed
    (died,) = events_named(run, R.WORKER_DIED)
    assert died["pid"] == killed["pid"] and died["exit"] == "killed by signal 9"
    ended = [c for e in events_named(run, R.WORKERS) for c in e.get("ended", [])]
    assert ended[0]["pid"] == killed["pid"] and ended[0]["uss_bytes"] > 0
    assert "killed by signal 9" in R.Event.from_json(died).summary()
    assert events[-1]["event"] == R.RUN_FINISHED and events[-1]["reason"] == "finished"


# ---- the guard counts the trainer and its workers ---------------------------------------------
@pytest.mark.slow
def test_the_guard_stops_a_run_whose_workers_fill_the_limit(tmp_path):
    from probes.counters.host import RssReader

    rss = RssReader().read()
    limit = rss + 320 * MiB  # the trainer stays far below; its workers' leak passes it
    run, mon = run_loop(tmp_path, Items(leak_bytes=LEAK_BYTES), steps=200, paced=True,
                        max_memory_bytes=limit)
    steps, _ = metrics_rows(run)
    (guard,) = events_named(run, R.MEMORY_GUARD)
    assert guard["counter"] == TREE_COUNTER and guard["limit_bytes"] == limit
    assert steps[-1]["step"] == guard["step"] < 200  # stopped there
    last = steps[-1]
    assert last["host_rss_bytes"] < limit - 128 * MiB  # RSS alone would have let it run on
    assert last["host_rss_bytes"] + last["workers_uss_bytes"] > limit - 64 * MiB


# ---- w with workers ----------------------------------------------------------------------------
def test_who_holds_with_workers_says_it_cannot_walk_their_objects(tmp_path):
    def ask(mon, step):
        if step == 4:
            mon.control.submit(Request("who_holds"))

    run, _ = run_loop(tmp_path, Items(), steps=10, on_step=ask, paced=True)
    (culprit,) = events_named(run, R.LEAK_CULPRIT)
    kinds = [c["kind"] for c in culprit["culprits"]]
    assert kinds[-1] == "workers" and culprit["culprits"][-1]["count"] == 2
    assert "cannot walk a worker's objects" in culprit["note"]


# ---- what is counted --------------------------------------------------------------------------
CHILD = """
import subprocess, sys
kept = bytearray(48 * 1024 * 1024)  # touched: resident and its own
grand = None
if len(sys.argv) > 1:  # a worker that starts a process of its own
    grand = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
print(grand.pid if grand else 0, flush=True)
sys.stdin.read()
"""


def test_the_sampler_folds_a_workers_children_in_and_leaves_memtops_own_out():
    """This process may have other children (another test's workers not collected yet): the
    checks look at the ones started here."""
    import subprocess
    import sys

    from probes.counters.proctree import read_memory
    from probes.counters.workers import ANALYSIS, ProcessTreeSampler

    def start(*args):
        proc = subprocess.Popen([sys.executable, "-c", CHILD, *args], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE)
        return proc, int(proc.stdout.readline())

    (worker, grand), (own, _) = start("with a child"), start()
    sampler = ProcessTreeSampler(interval_s=0.2, exclude=lambda: [own.pid])
    mine = {worker.pid, own.pid, grand}
    try:
        reading = sampler.read_once()
        counted = {c.pid: c for c in reading.children}
        assert worker.pid in counted and not {own.pid, grand} & set(counted)
        alone, child = read_memory(worker.pid, 4096), read_memory(grand, 4096)
        assert counted[worker.pid].rss_bytes >= alone[0] + 0.9 * child[0]  # its child in it
        assert counted[worker.pid].uss_bytes >= 48 * MiB
        assert reading.pss_bytes <= reading.rss_bytes
        changes = [c for c in sampler.take_changes() if c.pid in mine]
        assert [(c.what, c.pid) for c in changes if c.what == "started"] == [
            ("started", worker.pid)]
        assert [(c.what, c.pid, c.why) for c in changes if c.what == "left_out"] == [
            ("left_out", own.pid, ANALYSIS)]
        sampler.read_once()
        assert [c for c in sampler.take_changes() if c.pid in mine] == []  # said once
    finally:
        for proc in (worker, own):
            proc.stdin.close()
            proc.wait(timeout=60)
    gone = sampler.read_once()
    assert worker.pid not in {c.pid for c in gone.children}
    assert [c.what for c in sampler.take_changes() if c.pid == worker.pid] == ["ended"]


def test_a_monitor_leaves_out_its_profiler_analysis_child(tmp_path):
    from probes.traces.worker import analysis_pids

    def loop():
        model, opt = tiny_model()
        with Monitor(model, opt, run_dir=tmp_path, listen=False, write_report=False) as mon:
            assert mon.session.workers.exclude is analysis_pids
            assert "memtop's profiler-analysis child" in mon.session.workers.describe()
        return mon

    mon = in_thread(loop)
    (started,) = events_named(mon.run_dir, R.RUN_STARTED)
    assert "smaps_rollup" in started["workers_counter"]
