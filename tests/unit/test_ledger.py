"""The memory ledger: exact byte lines from a real run, saved activations that scale as the
tutorial says (×2 for B, more than ×2 for T with explicit attention), and a pack hook that keeps
nothing alive."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch
from factories import events_named, in_thread, make_sample, metrics_rows, run_context

from probes.counters.memory import MemoryProbe
from probes.instruments.hooks import StepTensors
from probes.instruments.ledger import Ledger, activation_prediction
from probes.instruments.tensor_bytes import SavedTensorMeter, unique_bytes
from probes.runfolder import create_run_dir
from trainer.loop import Trainer
from trainer.model import GPT, GPTConfig


def _ledger_events(run_dir: Path) -> list[dict]:
    return events_named(run_dir, "ledger")


def _set_up(ledger: Ledger, tmp_path: Path, model: torch.nn.Module, warmup_steps: int) -> Ledger:
    """The ledger on a CPU loop with ``model`` that runs until stopped, as a loop sets it up."""
    ledger.setup(run_context(tmp_path, model=model, optimizer=torch.optim.AdamW(model.parameters()),
                             memory=MemoryProbe(torch.device("cpu")), warmup_steps=warmup_steps))
    return ledger


def _run(config, ledger: Ledger) -> Path:
    run_dir = create_run_dir(config.run_dir)
    trainer = Trainer(config, run_dir, hooks=[ledger])
    assert in_thread(trainer.run) == 0
    return run_dir


@pytest.mark.parametrize("amp", ["bf16", "off"])
def test_exact_lines_match_the_tensors(tiny_config, amp):
    config = tiny_config(steps=3, amp=amp)  # warmup 2: the ledger measures step 3
    ledger = Ledger()
    run_dir = _run(config, ledger)
    events = _ledger_events(run_dir)
    assert len(events) == 1
    event = events[0]
    assert event["sampled_step"] == 3 and event["step"] == 3
    lines = {line["name"]: line for line in event["lines"]}
    for line in event["lines"]:
        assert set(line) == {"name", "measured_bytes", "predicted_bytes", "formula", "note"}

    model, optimizer = ledger.ctx.model, ledger.ctx.optimizer
    params = list(model.parameters())  # the tied wte/lm_head weight appears once here
    exact = sum(p.numel() * p.element_size() for p in params)
    naive = sum(p.numel() * p.element_size()
                for _, p in model.named_parameters(remove_duplicate=False))
    tied = model.lm_head.weight
    assert naive == exact + tied.numel() * tied.element_size()  # dedup matters for this model
    assert lines["parameters"]["measured_bytes"] == exact
    assert lines["parameters"]["predicted_bytes"] == exact  # P × 4 B holds for fp32 weights
    assert lines["gradients"]["measured_bytes"] == exact  # grads take the weights' dtype

    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    moments = sum(v.numel() * v.element_size() for s in optimizer.state.values()
                  for k, v in s.items() if k in ("exp_avg", "exp_avg_sq"))
    assert moments == 2 * sum(p.numel() for p in params) * 4
    assert lines["optimizer state"]["measured_bytes"] == sum(
        v.numel() * v.element_size() for v in state)  # moments + one 4-byte step per tensor
    assert lines["optimizer state"]["predicted_bytes"] == moments

    linear = {m.weight.data_ptr(): m.weight.numel() for m in model.modules()
              if isinstance(m, torch.nn.Linear)}
    if amp == "bf16":
        assert lines["autocast weight copies"]["measured_bytes"] == 2 * sum(linear.values())
    else:
        assert "autocast weight copies" not in lines
    acts = lines["saved activations"]
    assert acts["measured_bytes"] > 0 and acts["predicted_bytes"] > 0
    assert event["attention_scores_bytes"] == event["predicted_attention_scores_bytes"]
    assert event["total_measured_bytes"] == sum(
        line["measured_bytes"] for line in event["lines"] if line["name"] in (
            "parameters", "gradients", "optimizer state", "autocast weight copies",
            "saved activations"))
    assert event["allocated_bytes"] >= event["tensors_at_snapshot_bytes"]  # glibc heap ⊇ tensors
    assert "allocator cache" not in lines  # glibc has no caching allocator: "malloc free"
    assert lines["malloc free"]["measured_bytes"] == (
        event["reserved_bytes"] - event["allocated_bytes"])
    # the formulas name the CPU's counters as its panes do, not CUDA's allocated / reserved
    assert lines["malloc free"]["formula"] == "heap held − heap used"
    assert lines["other / temporaries"]["formula"].startswith("heap used − lines above")


def test_ledger_event_only_when_it_changes(tiny_config):
    ledger = Ledger(every=2, min_gap_s=0)
    run_dir = _run(tiny_config(steps=15), ledger)
    assert ledger.measured_steps == [3, 5, 7, 9, 11, 13, 15]
    assert 1 <= len(_ledger_events(run_dir)) <= 3  # same shapes: the exact lines never move


def test_sampling_schedule(tmp_path):
    ledger = _set_up(Ledger(every=50, min_gap_s=0), tmp_path, torch.nn.Linear(2, 2), warmup_steps=5)
    due = [s for s in range(1, 200) if ledger.due(s)]
    assert due == [6, 56, 106, 156]


def _measure(batch: int, seq: int, attention: str, amp: bool = True,
             layers: int = 2) -> SavedTensorMeter:
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, n_layer=layers, n_head=4, n_embd=32,
                          attention=attention))
    _, keys = unique_bytes(list(model.parameters()) + list(model.buffers()))
    x = torch.randint(0, 256, (batch, seq))
    meter = SavedTensorMeter(exclude=keys)
    with meter, torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        _, loss = model(x, x)
    loss.backward()
    return meter


def test_saved_activations_scale_with_batch_and_t_squared():
    def run():
        base = _measure(2, 32, "explicit")
        return base, _measure(4, 32, "explicit"), _measure(2, 64, "explicit"), \
            _measure(2, 32, "sdpa"), _measure(2, 64, "sdpa"), _measure(2, 64, "explicit", layers=3)

    base, twice_b, twice_t, sdpa, sdpa_t, three = in_thread(run)
    ratio_b = twice_b.activation_bytes / base.activation_bytes
    assert 1.9 < ratio_b <= 2.0  # ~2×; the (T, T) causal masks do not grow with B
    ratio_t = twice_t.activation_bytes / base.activation_bytes
    assert ratio_t > 2.2  # the B×heads×T² scores quadruple
    assert twice_t.bytes_by_kind["scores"] == 4 * base.bytes_by_kind["scores"] > 0
    assert sdpa.bytes_by_kind["scores"] == 0  # no T×T matrix is kept
    assert 1.95 < sdpa_t.activation_bytes / sdpa.activation_bytes < 2.05
    # per layer (one more layer; the LM head cancels) the formula's k and s hold within 5%
    pred = activation_prediction(2, 64, 32, 1, 4, "explicit", "bf16", "cpu")
    per_layer = three.activation_bytes - twice_t.activation_bytes
    assert abs(per_layer / pred["bytes"] - 1) < 0.05
    assert pred["scores_bytes"] == three.bytes_by_kind["scores"] - twice_t.bytes_by_kind["scores"]


def test_pack_hook_keeps_no_graph_alive():
    """A pack hook returning ``t`` itself leaks saved outputs (and their graphs) for good."""

    def run():
        x = torch.randn(64, requires_grad=True)
        meter = SavedTensorMeter()
        with meter:
            y = x.exp()  # exp saves its own output for backward
        ref = weakref.ref(y)
        gc.disable()
        try:
            del y
            return ref() is None, meter.bytes_by_kind["activation"]
        finally:
            gc.enable()

    freed, saved = in_thread(run)
    assert saved == 64 * 4
    assert freed


class _BrokenLedger(Ledger):
    def _build(self, pending, sample):
        raise RuntimeError("ledger bug")


def test_a_ledger_failure_never_fails_the_training(tiny_config):
    ledger = _BrokenLedger(every=1)
    run_dir = _run(tiny_config(steps=5), ledger)  # _run asserts the trainer exited 0
    steps, events = metrics_rows(run_dir)
    failed = [e for e in events if e["event"] == "ledger_failed"]
    assert len(failed) == 1 and "ledger bug" in failed[0]["message"]
    assert ledger.measured_steps == [] and not ledger.due(4)
    assert len(steps) == 5


def test_a_new_batch_shape_is_measured_at_the_next_step(tmp_path):
    """A step measured on B=4, T=16 batches (the first after warmup 5), then a step of B=8:
    the ledger measures the next step, not 50 steps later."""

    def run():
        torch.manual_seed(0)
        model = GPT(GPTConfig(block_size=32, n_layer=1, n_head=2, n_embd=32))
        ledger = _set_up(Ledger(every=50, min_gap_s=0), tmp_path, model, warmup_steps=5)
        x = torch.randint(0, 256, (4, 16))
        with ledger.step_context(6):
            logits, loss = model(x, x)
            loss.backward()
            ledger.ctx.optimizer.step()
            ledger.ctx.optimizer.zero_grad(set_to_none=True)
        ledger.end_step(6, StepTensors(loss=loss, output=logits), make_sample(6))
        measured, due_before = list(ledger.measured_steps), ledger.due(20)
        wider = torch.zeros(8, 16, 3)
        ledger.end_step(19, StepTensors(loss=wider.sum(), output=wider), sample=None)
        return measured, due_before, ledger.due(20)

    measured, due_before, due_after = in_thread(run)
    assert measured == [6]
    assert not due_before
    assert due_after


def test_the_ledgers_heap_reading_is_in_its_steps_peak(tiny_config, monkeypatch):
    """A leaking CPU run skipped the end-of-forward heap read for its cost: the report said a
    heap peak of 217 MiB beside the ledger's 247 MiB heap used at the end of forward. The
    ledger's own reading now counts in its step's sampled peak, and the report says how
    often the end-of-forward read was taken."""
    from factories import read_jsonl

    from probes.analysis.report.build import build_report
    from probes.counters import memory

    monkeypatch.setattr(memory, "MID_STEP_BUDGET", 0.0)  # every budgeted mid-step read skipped
    monkeypatch.setattr(memory, "MID_STEP_FIRST", 0)
    monkeypatch.setattr(memory, "MID_STEP_EVERY", 10**6)
    run_dir = _run(tiny_config(steps=4), Ledger())
    (event,) = _ledger_events(run_dir)
    rows = {r["step"]: r for r in read_jsonl(run_dir / "metrics.jsonl") if "event" not in r}
    assert rows[event["step"]]["step_peak_allocated_bytes"] >= event["allocated_bytes"]
    finished = read_jsonl(run_dir / "metrics.jsonl")[-1]
    assert finished["mid_step_heap_reads_skipped"] > 0
    note = build_report(run_dir)["results"]["peaks_note"]
    assert f"taken at {finished['mid_step_heap_reads']:,} of" in note and "lower bound" in note
