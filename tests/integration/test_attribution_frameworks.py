"""The memory attribution window through the framework callbacks: the real Hugging Face
Trainer (a tiny GPT-2) and the real Lightning Trainer (a GRU language model), each with
gradient accumulation 2; one window from ``attribute_at``, one from the callback's
``request_attribution()`` during training. Each window's parameters are the model's, its
activations one micro-batch's, and the model is left without a hook."""

from __future__ import annotations

import pytest
from factories import events_named, import_example, in_thread, metrics_rows

from probes import records as R

pytestmark = pytest.mark.slow

STEPS, ACCUM, BATCH = 12, 2, 4


def hook_count(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def unique_param_bytes(model) -> int:
    seen = {}
    for p in model.parameters():
        st = p.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def check_windows(run, model):
    windows = events_named(run, R.MEMORY_ATTRIBUTION)
    assert [w["trigger"] for w in windows] == ["attribute_at", "request"], windows
    for w in windows:
        assert w["micro_batches"] == ACCUM
        assert w["params_total_bytes"] == unique_param_bytes(model)
        assert w["grads_total_bytes"] == w["params_total_bytes"]  # every parameter trains
        assert w["optimizer_total_bytes"] >= 2 * w["params_total_bytes"]  # AdamW's moments
        assert w["activations_total_bytes"] > 0
    steps = {r["step"]: r.get("disturbed") for r in metrics_rows(run)[0]}
    assert steps[windows[0]["steps"][0]] == "attributed"


def test_hf_trainer_gets_the_window_through_its_callback(tmp_path):
    from probes.integrations.transformers import MemtopCallback

    example = import_example("hf_trainer")
    from transformers import TrainerCallback

    memtop = MemtopCallback(listen=False, attribute_at=[3])

    class AskAtStep(TrainerCallback):  # a user's own callback asking for a window
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 7:
                memtop.request_attribution()

    trainer = example.make_trainer(tmp_path, steps=STEPS, grad_accum=ACCUM, batch_size=BATCH,
                                   eval_steps=None, save_steps=None,
                                   callbacks=[memtop, AskAtStep()])
    model = trainer.model
    before = hook_count(model)
    in_thread(trainer.train)
    check_windows(memtop.driver.last_run, model)
    rows = {r["module"] for r in events_named(memtop.driver.last_run,
                                              R.MEMORY_ATTRIBUTION)[0]["modules"]}
    assert "transformer.h.0.attn" in rows and "transformer.h.1.mlp" in rows
    assert hook_count(model) <= before + 1  # HF's own hooks, memtop's batch counter at most


def test_lightning_gets_the_window_through_its_callback(tmp_path):
    from probes.integrations.lightning import MemtopCallback

    example = import_example("lightning_fit")
    import lightning.pytorch as pl

    memtop = MemtopCallback(listen=False, attribute_at=[3])

    class AskAtStep(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step == 7 and (batch_idx + 1) % ACCUM == 0:
                memtop.request_attribution()

    trainer = example.make_trainer(tmp_path, steps=STEPS, accumulate=ACCUM, val_every=None,
                                   callbacks=[memtop, AskAtStep()], checkpoints=False)
    module = example.make_module()
    train, _ = example.loaders(STEPS, ACCUM, BATCH)
    before = hook_count(module)
    in_thread(trainer.fit, module, train)
    check_windows(memtop.driver.last_run, module)
    rows = {r["module"] for r in events_named(memtop.driver.last_run,
                                              R.MEMORY_ATTRIBUTION)[0]["modules"]}
    assert {"embed", "gru", "head"} <= rows
    assert hook_count(module) == before
