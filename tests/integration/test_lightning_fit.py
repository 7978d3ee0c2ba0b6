"""memtop's callback inside the real Lightning Trainer (probes/integrations/lightning.py): a
small LightningModule (examples/lightning_fit.py) fitted on CPU with accumulate_grad_batches=2,
then followed by `memtop view` (the Pilot) and stopped from it. Lightning takes seconds to
import, so one finished run serves the read-only checks."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from factories import (
    events_named,
    import_example,
    in_thread,
    metrics_rows,
    wait_for,
    wait_until,
)

from probes import records as R

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("lightning_fit")]

STEPS, ACCUM, BATCH = 40, 2, 4


@pytest.fixture(scope="module")
def example():
    return import_example("lightning_fit")


@pytest.fixture(scope="module")
def fit_run(example, tmp_path_factory):
    """40 optimizer steps of 2 micro-batches, validating (and checkpointing) every 10:
    (run folder, the trainer, the module)."""
    from probes.integrations.lightning import MemtopCallback

    root = tmp_path_factory.mktemp("lightning")
    memtop = MemtopCallback(listen=False)
    trainer = example.make_trainer(root, steps=STEPS, accumulate=ACCUM, val_every=10,
                                   callbacks=[memtop])
    module = example.make_module()
    train, val = example.loaders(STEPS, ACCUM, BATCH)
    in_thread(trainer.fit, module, train, val)
    return memtop.driver.last_run, trainer, module


def test_one_row_per_optimizer_step_with_lightning_loss(fit_run):
    run, trainer, module = fit_run
    assert trainer.global_step == STEPS
    steps, events = metrics_rows(run)
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    micro = module.micro_losses  # what Lightning's training_step computed, batch by batch
    assert len(micro) == STEPS * ACCUM
    for row in steps:  # the step's mean loss over both micro-batches
        pair = micro[(row["step"] - 1) * ACCUM: row["step"] * ACCUM]
        assert row["loss"] == pytest.approx(sum(pair) / ACCUM, rel=1e-5)
        assert row["micro_batches"] == ACCUM
        tokens = row["tokens_per_s"] * row["step_ms"] / 1000
        assert tokens == pytest.approx(ACCUM * BATCH * 32, rel=1e-6)
    assert events[-1]["event"] == R.RUN_FINISHED and events[-1]["reason"] == "finished"
    assert (run / "report.md").is_file()
    assert run.parent == Path(trainer.default_root_dir) / "memtop"


def test_validation_and_checkpoints_are_events_not_leaks(fit_run):
    run, trainer, _ = fit_run
    _, events = metrics_rows(run)
    evals = [e for e in events if e["event"] == R.EVALUATE]
    assert [e["step"] for e in evals] == [10, 20, 30, 40]
    assert all("val_loss" in e["metrics"] for e in evals)
    saves = [e for e in events if e["event"] == R.SAVE]
    assert [e["step"] for e in saves] == [10, 20, 30, 40]
    assert R.EVENT_KINDS[R.SAVE].summary(saves[0]) == "checkpoint saved between steps"
    assert R.EVENT_KINDS[R.EVALUATE].summary(evals[0]).startswith("evaluation between steps, ")
    assert not [e for e in events if e["event"] == R.LEAK_SUSPECTED]
    config = json.loads((run / "config.json").read_text())
    assert config["framework"] == "lightning"
    assert config["trainer"]["accumulate_grad_batches"] == ACCUM
    assert config["monitor"]["model"] == "TinyLM"


def keep_outputs_callback():
    """A user's own callback that keeps every batch's outputs (the logits the module returns
    with its loss): a leak."""
    import lightning.pytorch as pl

    class KeepOutputs(pl.Callback):
        def __init__(self):
            self.kept = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.kept.append(outputs["logits"])

    return KeepOutputs()


async def test_viewer_sees_a_user_leak_and_stops_fit(example, tmp_path):
    from probes.integrations.lightning import MemtopCallback
    from tui.app import MemtopApp

    memtop, leak = MemtopCallback(), keep_outputs_callback()
    trainer = example.make_trainer(tmp_path / "pl", steps=5000, accumulate=ACCUM,
                                   val_every=None, callbacks=[memtop, leak], checkpoints=False)
    train, _ = example.loaders(5000, ACCUM, BATCH)
    done = threading.Event()

    def fit():
        trainer.fit(example.make_module(), train)
        done.set()  # fit() returned normally

    thread = threading.Thread(target=fit)
    thread.start()
    try:
        sock = wait_until(lambda: next((tmp_path / "pl" / "memtop").glob("*/control.sock"),
                                       None), "the run's socket")
        run = sock.parent
        app = MemtopApp.for_folder(run)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: bool(app.run_state.alerts), "the user's leak alert")
            # the finder's second look, a few steps after the alert, names the user's list
            await wait_for(pilot, lambda: "KeepOutputs" in app.culprit_box.text, "the culprit")
            await pilot.press("r")
            await wait_for(pilot, lambda: any("report written" in n.message
                                              for n in app.notices), "r's report")
            assert (run / "report.md").is_file()  # the viewer wrote it from the live folder
            await pilot.press("x")
            await pilot.press("y")
            await wait_for(pilot, done.is_set, "fit() to return")
            await wait_for(pilot, lambda: app.run_state.finished, "the viewer sees the end")
            await pilot.press("q")
    finally:
        if thread.is_alive() and memtop.monitor is not None:
            memtop.monitor.control.stop("test cleanup")
        thread.join(120)
    assert done.is_set() and 0 < trainer.global_step < 5000
    steps, events = metrics_rows(run)
    assert len(steps) == trainer.global_step  # stopped at the next step boundary
    assert any(e["event"] == R.LEAK_SUSPECTED for e in events)
    assert events[-1]["reason"] == "stopped from a viewer"
    culprit = next(e for e in events if e["event"] == R.LEAK_CULPRIT)
    holders = [c.get("holder") or "" for c in culprit["culprits"]]
    assert any("kept" in h and "KeepOutputs" in h for h in holders), holders


def test_the_training_loaders_workers_are_read_through_the_callback(example, tmp_path):
    """The callback's Monitor samples the fit's DataLoader workers like any loop's: rows with
    their count and bytes, a workers event (probes/counters/workers.py)."""
    import lightning as L

    from probes.integrations.lightning import MemtopCallback

    class TwoReadings(L.Callback):  # the fit waits for two readings at its 3rd batch
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx == 2:
                sampler = memtop.driver.monitor.session.workers
                first = sampler.wait_for_reading(sampler.latest.seq, 60)
                assert first is not None and sampler.wait_for_reading(first.seq, 60)

    memtop = MemtopCallback(listen=False, workers_sample_s=0.1)
    trainer = example.make_trainer(tmp_path, steps=6, accumulate=1, val_every=None,
                                   checkpoints=False, callbacks=[memtop, TwoReadings()])
    train, _ = example.loaders(6, 1, BATCH, workers=2)
    in_thread(trainer.fit, example.make_module(), train)
    steps, _ = metrics_rows(memtop.driver.last_run)
    seen = [r for r in steps if r.get("workers")]
    assert seen and all(r["workers"] == 2 and r["workers_uss_bytes"] > 0 for r in seen)
    started = [c for e in events_named(memtop.driver.last_run, R.WORKERS)
               for c in e.get("started", [])]
    assert len(started) == 2
