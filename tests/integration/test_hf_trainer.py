"""memtop's callback inside the real Hugging Face Trainer (probes/integrations/transformers.py):
a GPT-2 built from GPT2Config (no download: HF offline, nothing fetched) trained on CPU on a
synthetic dataset (examples/hf_trainer.py builds both) with gradient accumulation 2, then
followed by `memtop view` (the Pilot) and stopped from it. transformers takes seconds to import,
so one finished run serves the read-only checks."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from factories import import_example, in_thread, metrics_rows, wait_for, wait_until

from probes import records as R

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hf_trainer")]

STEPS, ACCUM, BATCH = 40, 2, 4


@pytest.fixture(scope="module")
def example():
    return import_example("hf_trainer")  # sets HF's offline switches before transformers loads


@pytest.fixture(scope="module")
def hf_run(example, tmp_path_factory):
    """40 optimizer steps of 2 micro-batches, HF logging every 5 steps, evaluating every 10 and
    saving every 20: (run folder, HF's trainer, train()'s result)."""
    from probes.integrations.transformers import MemtopCallback

    out = tmp_path_factory.mktemp("hf")
    memtop = MemtopCallback(listen=False)
    trainer = example.make_trainer(out, steps=STEPS, grad_accum=ACCUM, batch_size=BATCH,
                                   logging_steps=5, eval_steps=10, save_steps=20,
                                   callbacks=[memtop])
    result = in_thread(trainer.train)
    return memtop.driver.last_run, trainer, result


def test_one_row_per_optimizer_step_with_hf_logged_loss(hf_run):
    run, trainer, result = hf_run
    assert result.global_step == STEPS
    steps, events = metrics_rows(run)
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    logged = {h["step"]: h for h in trainer.state.log_history if "loss" in h}
    assert sorted(logged) == list(range(5, STEPS + 1, 5))
    for row in steps:
        if row["step"] in logged:  # HF's own number on the step it logged it at
            assert row["loss"] == pytest.approx(logged[row["step"]]["loss"], rel=1e-6)
            assert row["grad_norm"] == pytest.approx(logged[row["step"]]["grad_norm"], rel=1e-6)
        else:
            assert row["loss"] is None  # HF did not read it: memtop added no sync
        assert row["micro_batches"] == ACCUM
        # tokens/s counts both micro-batches: B × T tokens each
        tokens = row["tokens_per_s"] * row["step_ms"] / 1000
        assert tokens == pytest.approx(ACCUM * BATCH * 32, rel=1e-6)
    assert events[-1]["event"] == R.RUN_FINISHED and events[-1]["reason"] == "finished"
    assert (run / "report.md").is_file()
    report = json.loads((run / "report.json").read_text())
    assert report["input"]["counted_per_step"] == "tokens"  # from the batches HF handed over
    assert report["results"]["final_loss"] == pytest.approx(logged[STEPS]["loss"], rel=1e-6)


def test_evaluation_and_saves_are_events_between_steps_not_leaks(hf_run):
    run, trainer, _ = hf_run
    steps, events = metrics_rows(run)
    evals = [e for e in events if e["event"] == R.EVALUATE]
    saves = [e for e in events if e["event"] == R.SAVE]
    assert [e["step"] for e in evals] == [10, 20, 30, 40]
    assert all("eval_loss" in e["metrics"] and e["seconds"] >= 0 for e in evals)
    assert [e["step"] for e in saves] == [20, 40]
    assert all(e["path"].endswith(f"checkpoint-{e['step']}") for e in saves)
    assert not [e for e in events if e["event"] == R.LEAK_SUSPECTED]
    started = events[0]
    assert started["event"] == R.RUN_STARTED and started["amp"] == "off"
    assert {"leak_start", "leak_stop", "profile"} <= set(started["requests"])
    config = json.loads((run / "config.json").read_text())
    assert config["framework"] == "transformers" and config["steps"] == STEPS
    assert config["training_arguments"]["gradient_accumulation_steps"] == ACCUM
    assert config["monitor"]["model"] == "GPT2LMHeadModel"
    assert run.parent == Path(trainer.args.output_dir) / "memtop"


def keep_logits_callback():
    """A user's own callback that collects each step's predictions through a forward hook:
    the classic leak (every training step's logits stay alive)."""
    from transformers import TrainerCallback

    class KeepLogits(TrainerCallback):
        def __init__(self):
            self.kept = []

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            model.register_forward_hook(self.keep)

        def keep(self, module, inputs, output):
            if module.training:
                self.kept.append(output.logits.detach())

    return KeepLogits()


async def test_viewer_sees_a_user_leak_steers_and_stops_training(example, tmp_path):
    from probes.integrations.transformers import MemtopCallback
    from tui.app import MemtopApp

    memtop, leak = MemtopCallback(), keep_logits_callback()
    trainer = example.make_trainer(tmp_path / "hf", steps=5000, grad_accum=ACCUM,
                                   batch_size=BATCH, logging_steps=50, eval_steps=None,
                                   save_steps=100_000, callbacks=[memtop, leak])
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(result=trainer.train()))
    thread.start()
    try:
        sock = wait_until(lambda: next((tmp_path / "hf" / "memtop").glob("*/control.sock"),
                                       None), "the run's socket")
        run = sock.parent
        app = MemtopApp.for_folder(run)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: bool(app.run_state.alerts), "the user's leak alert")
            # the finder's second look, a few steps after the alert, names the user's list
            await wait_for(pilot, lambda: "KeepLogits" in app.culprit_box.text, "the culprit")
            await pilot.press("p")
            await wait_for(pilot, lambda: bool(app.ops_table.row_names), "top ops via socket")
            await pilot.press("space")
            await wait_for(pilot, lambda: app.run_state.state == "paused", "the run paused")
            await pilot.press("space")
            await wait_for(pilot, lambda: app.run_state.state == "running", "resumed")
            await pilot.press("x")
            await pilot.press("y")
            await wait_for(pilot, lambda: not thread.is_alive(), "train() to return")
            await wait_for(pilot, lambda: app.run_state.finished, "the viewer sees the end")
            await pilot.press("q")
    finally:
        if thread.is_alive() and memtop.monitor is not None:
            memtop.monitor.control.stop("test cleanup")
        thread.join(120)
    result = box["result"]  # HF's own train() returned, with its TrainOutput
    assert 0 < result.global_step < 5000 and len(leak.kept) >= 2 * 10
    steps, events = metrics_rows(run)
    assert len(steps) == result.global_step  # stopped at the next step boundary
    alert = next(e for e in events if e["event"] == R.LEAK_SUSPECTED)
    assert alert["bytes_per_step"] > 0
    assert any(e["event"] == R.PROFILE_DONE for e in events)
    assert events[-1]["reason"] == "stopped from a viewer"
    # HF ended as at its last step: the checkpoint of the step it stopped at
    assert (tmp_path / "hf" / f"checkpoint-{result.global_step}").is_dir()
    culprit = next(e for e in events if e["event"] == R.LEAK_CULPRIT)
    holders = [c.get("holder") or "" for c in culprit["culprits"]]
    assert any("kept" in h and "KeepLogits" in h for h in holders), holders


def test_a_train_that_raised_is_closed_by_the_next_one(example, tmp_path):
    """HF has no exception hook: a train() that raises leaves its run open; the next train()
    closes it (every row it finished kept) and counts each batch once."""
    from transformers import TrainerCallback

    from probes.integrations.transformers import MemtopCallback

    class Boom(TrainerCallback):
        raised = False

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3 and not self.raised:
                self.raised = True
                raise RuntimeError("a bug in the user's callback")

    memtop = MemtopCallback(listen=False)
    trainer = example.make_trainer(tmp_path / "hf", steps=5, grad_accum=ACCUM, batch_size=BATCH,
                                   logging_steps=1, eval_steps=None, save_steps=None,
                                   callbacks=[memtop, Boom()])
    with pytest.raises(RuntimeError, match="user's callback"):
        in_thread(trainer.train)
    first = memtop.driver.last_run
    in_thread(trainer.train)
    second = memtop.driver.last_run
    assert first != second
    steps, events = metrics_rows(first)
    assert [r["step"] for r in steps] == [1, 2, 3]  # step 3 ended, its log never came
    assert events[-1]["reason"] == "a new training run started before the last one ended"
    steps, events = metrics_rows(second)
    assert len(steps) == 5 and events[-1]["reason"] == "finished"
    for row in steps:
        assert row["tokens_per_s"] * row["step_ms"] / 1000 == pytest.approx(ACCUM * BATCH * 32)
