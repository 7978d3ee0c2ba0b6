"""The memory attribution window on a real Monitor: when it opens and closes, that its hooks are
always taken off, what it counts for shared and re-entered modules, its bound, how it agrees
with the ledger, and which steps it disturbs. probes/instruments/attribution.py."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
from factories import events_named, metrics_rows

from probes import Monitor
from probes import records as R
from probes.records.attribution import (
    MAX_EVENT_BYTES,
    OTHERS,
    at_depth,
    block_groups,
    bound_rows,
    choose_depth,
    event_size,
    totals,
)
from probes.records.attribution_hints import attribution_hints, growth
from probes.records.disturbed import AFTER_ATTRIBUTION, ATTRIBUTED, mark_disturbed
from trainer.model import GPT, GPTConfig


def hook_count(model: nn.Module) -> int:
    """Forward hooks, pre-hooks and parameters' post-accumulate hooks on ``model``."""
    n = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    return n + sum(len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
                   for p in model.parameters())


def saved_hooks_on() -> bool:
    return torch._C._autograd._top_saved_tensors_default_hooks(False) is not None


def gpt(layers: int = 2) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=32, n_layer=layers, n_head=2, n_embd=32))


def run(tmp_path, model, steps=6, step_fn=None, **options):
    """A Monitor over ``model`` for ``steps`` steps; ``step_fn(mon, s, i)`` runs step i."""
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randint(0, 256, (2, 8)) if isinstance(model, GPT) else torch.randn(2, 8)

    def plain(mon, s, i):
        out = model(x, x) if isinstance(model, GPT) else model(x)
        loss = out[1] if isinstance(out, tuple) else out.square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        s.set(loss=loss)

    options = {"warmup_steps": 1, "listen": False, "write_report": False,
               "max_steps": steps, **options}
    with Monitor(model, opt, run_dir=tmp_path / "runs", **options) as mon:
        for i in range(1, steps + 1):
            with mon.step() as s:
                (step_fn or plain)(mon, s, i)
    return mon


# ---- the window -------------------------------------------------------------------------------
def test_no_hook_outside_the_window_and_every_hook_off_after_it(tmp_path):
    model = gpt()
    before = hook_count(model)
    seen: dict[int, tuple[int, bool]] = {}

    def step_fn(mon, s, i):
        seen[i] = (hook_count(model), saved_hooks_on())
        out = model(torch.randint(0, 256, (2, 8)), torch.randint(0, 256, (2, 8)))
        out[1].backward()
        mon.optimizer.step()
        mon.optimizer.zero_grad(set_to_none=True)

    mon = run(tmp_path, model, steps=6, step_fn=step_fn, attribute_at=[3], ledger=False)
    own = seen[1][0]  # the Monitor's own (its forward counter, the step split) while it runs
    assert seen[1][0] == seen[2][0] == seen[5][0] == seen[6][0] == own
    assert not any(seen[i][1] for i in (1, 2, 5, 6))  # no saved-tensor hook either
    assert seen[3][0] > own and seen[4][0] > own and seen[3][1] and seen[4][1]
    assert hook_count(model) == before and not saved_hooks_on()
    assert mon.attribution.windows_done == 1
    started = events_named(mon.run_dir, R.ATTRIBUTION_STARTED)
    assert [e["step"] for e in started] == [3]
    assert started[0]["modules_hooked"] == len(list(model.modules()))


def test_a_step_that_raises_inside_the_window_leaves_no_hook_and_the_run_goes_on(tmp_path):
    model = gpt()
    before = hook_count(model)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randint(0, 256, (2, 8))
    during = -1
    with Monitor(model, opt, run_dir=tmp_path / "runs", warmup_steps=1, listen=False,
                 write_report=False, attribute_at=[2], max_steps=6, ledger=False) as mon:
        for i in range(1, 7):
            try:
                with mon.step():
                    logits, loss = model(x, x)
                    if i == 3:  # the window's measured step, raising mid-forward's aftermath
                        raise RuntimeError("a bad batch")
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
            except RuntimeError:
                opt.zero_grad(set_to_none=True)
                assert hook_count(model) == during and not saved_hooks_on()
            if i == 1:
                during = hook_count(model)  # the Monitor's own hooks, while it runs
    assert hook_count(model) == before and not saved_hooks_on()
    data = events_named(mon.run_dir, R.MEMORY_ATTRIBUTION)
    # the failed step counted nothing; its number is run again, and measured then
    assert len(data) == 1 and data[0]["steps"] == [3] and data[0]["micro_batches"] == 1
    steps, _ = metrics_rows(mon.run_dir)
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]


def test_cancelled_mid_step_the_hooks_still_come_off_and_nothing_is_written(tmp_path):
    model = gpt()
    before = hook_count(model)

    def step_fn(mon, s, i):
        logits, loss = model(torch.randint(0, 256, (2, 8)), torch.randint(0, 256, (2, 8)))
        if i == 3:
            assert mon.attribution.cancel_attribution(i, "cancelled in the forward")
        loss.backward()
        mon.optimizer.step()
        mon.optimizer.zero_grad(set_to_none=True)

    mon = run(tmp_path, model, steps=5, step_fn=step_fn, attribute_at=[2], attribute_steps=2)
    assert hook_count(model) == before and not saved_hooks_on()
    assert events_named(mon.run_dir, R.MEMORY_ATTRIBUTION) == []
    cancelled = events_named(mon.run_dir, R.ATTRIBUTION_CANCELLED)
    assert [c["reason"] for c in cancelled] == ["cancelled in the forward"]
    steps, _ = metrics_rows(mon.run_dir)
    assert [r["disturbed"] for r in steps][1:4] == [ATTRIBUTED, ATTRIBUTED, AFTER_ATTRIBUTION]


def test_a_request_through_the_control_opens_and_a_second_cancels(tmp_path):
    model = gpt()

    def step_fn(mon, s, i):
        if i == 2:
            mon.request_attribution()
        if i == 6:
            mon.request_attribution()
        if i == 7:
            mon.cancel_attribution()
        logits, loss = model(torch.randint(0, 256, (2, 8)), torch.randint(0, 256, (2, 8)))
        loss.backward()
        mon.optimizer.step()
        mon.optimizer.zero_grad(set_to_none=True)

    mon = run(tmp_path, model, steps=10, step_fn=step_fn, attribute_steps=3)
    rows = [json.loads(x) for x in (mon.run_dir / "metrics.jsonl").read_text().splitlines()]
    names = [(r["event"], r["step"]) for r in rows if "attribution" in r.get("event", "")]
    assert names == [(R.ATTRIBUTION_STARTED, 3), (R.MEMORY_ATTRIBUTION, 6),
                     (R.ATTRIBUTION_STARTED, 7), (R.ATTRIBUTION_CANCELLED, 7)]
    assert "attribute" in events_named(mon.run_dir, R.RUN_STARTED)[0]["requests"]


def test_a_module_called_twice_is_one_row_with_both_calls_and_a_shared_weight_counts_once(
        tmp_path):
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(8, 8)
            self.tied = nn.Linear(8, 8)
            self.tied.weight = self.inner.weight  # weight sharing across two modules
            self.alias = self.inner  # the same module under two names

        def forward(self, x):
            return self.tied(torch.relu(self.alias(self.inner(x))))

    model = Twice()
    mon = run(tmp_path, model, attribute_at=[2])
    rows = {r["module"]: r for r in mon.attribution.last["modules"]}
    assert "alias" not in rows  # one row per module object, under its first name
    assert rows["inner"]["calls"] == 2
    assert rows["inner"]["activations_bytes"] == 2 * 2 * 8 * 4  # both calls' inputs, x and h1
    assert rows["inner"]["params_bytes"] == (64 + 8) * 4  # the shared weight, counted here
    assert rows["tied"]["params_bytes"] == 8 * 4  # only its own bias
    assert rows[""]["activations_bytes"] == 2 * 8 * 4  # relu's output, saved in the root
    assert mon.attribution.last["params_total_bytes"] == (64 + 8 + 8) * 4


def test_totals_reconcile_with_the_ledger_on_the_same_shapes(tmp_path):
    mon = run(tmp_path, gpt(), steps=6, attribute_at=[4])
    data = mon.attribution.last
    ledger = events_named(mon.run_dir, R.LEDGER)[0]
    lines = {ln["name"]: ln["measured_bytes"] for ln in ledger["lines"]}
    assert data["params_total_bytes"] == lines["parameters"]
    assert data["grads_total_bytes"] == lines["gradients"]
    assert data["optimizer_total_bytes"] == lines["optimizer state"]
    assert data["activations_total_bytes"] == lines["saved activations"]  # 5% asked: exact
    assert data["weight_copies_bytes"] == lines.get("autocast weight copies", 0)
    assert sum(r["activations_bytes"] for r in data["modules"]) + data[
        "unattributed_bytes"] == data["activations_total_bytes"]


def test_the_ledger_leaves_a_window_step_to_the_step_after(tmp_path):
    """Both use saved-tensor hooks; a ledger measurement due in a window waits for its end."""
    mon = run(tmp_path, gpt(), steps=6, attribute_at=[2])  # the ledger is due at step 2
    ledgers = events_named(mon.run_dir, R.LEDGER)
    assert ledgers and ledgers[0]["sampled_step"] == 4
    saved = {ln["name"]: ln["measured_bytes"] for ln in ledgers[0]["lines"]}
    assert saved["saved activations"] == mon.attribution.last["activations_total_bytes"] > 0


def test_the_window_waits_for_a_profiler_window_to_end(tmp_path):
    mon = run(tmp_path, gpt(), steps=12, profile_at=[2], attribute_at=[3])
    rows = [json.loads(x) for x in (mon.run_dir / "metrics.jsonl").read_text().splitlines()]
    traced = [r["step"] for r in rows if r.get("profiling")]
    started = [r["step"] for r in rows if r.get("event") == R.ATTRIBUTION_STARTED]
    assert traced and started and started[0] > max(traced)
    assert events_named(mon.run_dir, R.MEMORY_ATTRIBUTION)


def test_window_steps_leave_peaks_and_timing_and_old_folders_read_the_same(tmp_path):
    mon = run(tmp_path, gpt(), steps=7, attribute_at=[3], attribute_steps=2)
    steps, _ = metrics_rows(mon.run_dir)
    reasons = {r["step"]: r["disturbed"] for r in steps}
    assert [reasons[i] for i in (2, 3, 4, 5, 6, 7)] == [
        None, ATTRIBUTED, ATTRIBUTED, ATTRIBUTED, AFTER_ATTRIBUTION, None]
    rows = [json.loads(x) for x in (mon.run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        r.pop("disturbed", None)
    mark_disturbed(rows)  # a folder read back with today's rule
    assert {r["step"]: r["disturbed"] for r in rows if "event" not in r} == reasons


def test_the_run_ends_mid_window_with_what_it_measured(tmp_path):
    mon = run(tmp_path, gpt(), steps=4, attribute_at=[2], attribute_steps=5)
    data = events_named(mon.run_dir, R.MEMORY_ATTRIBUTION)
    assert len(data) == 1 and data[0]["partial"] and data[0]["steps"] == [3, 4]
    names = [r.get("event") for r in (json.loads(x) for x in (
        mon.run_dir / "metrics.jsonl").read_text().splitlines()) if "event" in r]
    assert names.index(R.MEMORY_ATTRIBUTION) < names.index(R.RUN_FINISHED)


# ---- the bound --------------------------------------------------------------------------------
@pytest.mark.slow
def test_ten_thousand_submodules_stay_under_the_bound(tmp_path):
    class Wide(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(
                nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(3400))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    model = Wide()
    assert len(list(model.modules())) > 10_000
    mon = run(tmp_path, model, steps=3, attribute_at=[1], warmup_steps=0)
    event = events_named(mon.run_dir, R.MEMORY_ATTRIBUTION)[0]
    line = next(x for x in (mon.run_dir / "metrics.jsonl").read_text().splitlines()
                if R.MEMORY_ATTRIBUTION in x)
    assert len(line.encode()) <= MAX_EVENT_BYTES
    rows = event["modules"]
    assert len(rows) <= 300 and rows[-1]["module"] == f"layers.{OTHERS}"
    assert event["rows_folded"] > 9000 and rows[-1]["folded"] > 3000
    assert totals(rows)["params_bytes"] == event["params_total_bytes"] == 3400 * 72 * 4
    assert totals(rows)["activations_bytes"] + event["unattributed_bytes"] == event[
        "activations_total_bytes"]


def test_bound_rows_folds_deeper_levels_first_and_keeps_the_sums():
    rows = [{"module": f"a.{i}.b.{j}", "activations_bytes": i * 10 + j, "params_bytes": 1,
             "forward_peak_bytes": 5} for i in range(30) for j in range(20)]
    rows += [{"module": f"a.{i}", "forward_peak_bytes": 100 + i} for i in range(30)]
    bounded = bound_rows(rows, 100)
    assert len(bounded) <= 100
    assert {r["module"] for r in bounded} >= {f"a.{i}.b" for i in range(30)}
    assert totals(bounded)["activations_bytes"] == totals(rows)["activations_bytes"]
    assert next(r for r in bounded if r["module"] == "a.3")["forward_peak_bytes"] == 103
    tight = bound_rows(rows, 10)
    assert len(tight) == 10 and tight[-1]["module"] == f"a.{OTHERS}"
    assert totals(tight)["params_bytes"] == 600
    long = {"modules": [{"module": "x" * 2000 + str(i), "activations_bytes": i}
                        for i in range(400)]}
    from probes.records.attribution import fit_event
    assert event_size(fit_event(long)) <= MAX_EVENT_BYTES


# ---- the table's depth and the hints ------------------------------------------------------------
def test_the_table_shows_blocks_then_their_children(tmp_path):
    mon = run(tmp_path, gpt(layers=4), attribute_at=[2])
    rows = mon.attribution.last["modules"]
    level = choose_depth(rows)
    names = {r["module"] for r in at_depth(rows, level)}
    assert {f"transformer.h.{i}" for i in range(4)} <= names
    groups = {g["module"]: g for g in block_groups(rows, level)}
    assert set(groups) >= {"transformer.h.*.attn", "transformer.h.*.mlp"}
    assert groups["transformer.h.*.attn"]["members"] == 4


def test_hints_carry_the_measured_figures(tmp_path):
    model = GPT(GPTConfig(block_size=64, n_layer=2, n_head=4, n_embd=32))
    x = torch.randint(0, 256, (2, 64))

    def step_fn(mon, s, i):
        logits, loss = model(x, x)
        loss.backward()
        mon.optimizer.step()
        mon.optimizer.zero_grad(set_to_none=True)

    mon = run(tmp_path, model, step_fn=step_fn, attribute_at=[3],
              config={"seq_len": 64, "batch_size": 2})
    data = mon.attribution.last
    hints = data["hints"]
    attn = next(h for h in hints if h.startswith("transformer.h.*.attn keeps"))
    assert "T×T attention scores" in attn and "T=256" in attn
    assert any(h.startswith("checkpointing transformer.h.0–1 would free") for h in hints)
    assert any(h.startswith("the optimizer state is 2.0× the parameters") for h in hints)
    assert hints == attribution_hints(data)  # the event's hints are the records' function's
    assert growth(1.0, 0.0) == 4.0 and growth(0.0, 1.0) == 16.0
