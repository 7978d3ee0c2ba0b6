"""The memory attribution window against PyTorch's own MemTracker
(torch.distributed._tools.mem_tracker), on the same model, the same inputs, one step each.

What each tool counts for a module (docs/ATTRIBUTION.md, "Against MemTracker"): memtop, the
bytes autograd saves while the module runs; MemTracker, the bytes created while it runs and
still alive at its end (its output always). So, per module,

    MemTracker(M) = memtop(M) - inputs_saved(M) + outputs_not_saved(M)

(``inputs_saved``: M's tensor inputs that autograd saves inside M; ``outputs_not_saved``: M's
outputs that nothing inside M saves), exactly in fp32; the test measures both terms itself with
forward hooks and a saved-tensor hook. Where a module's input and output are the same size (a
transformer block, a residual block) the two tools agree within 10% directly. Parameters are
MemTracker's per module (a shared one counted once, by its first module), gradients and
optimizer state its totals: exact.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed._tools.mem_tracker import MemTracker, _ModState
from torch.utils.checkpoint import checkpoint

from probes import Monitor
from probes.instruments.tensor_bytes import storage_key
from probes.records.attribution import at_depth, choose_depth, sort_rows
from trainer.model import GPT, GPTConfig

CPU = torch.device("cpu")


# ---- the models -------------------------------------------------------------------------------
def tiny_gpt(layers: int = 3) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=32, n_layer=layers, n_head=2, n_embd=32))


class Gate(nn.Module):
    """A custom module with its own elementwise forward (a learned sigmoid gate)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1, channels, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.scale * x)


class ResBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.gate = Gate(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bn2(self.conv2(self.gate(self.bn1(self.conv1(x)))))


class ConvNet(nn.Module):
    """A small residual conv net: a stem that widens, three residual blocks, a linear head."""

    def __init__(self, blocks: int = 3, width: int = 8) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.blocks = nn.ModuleList(ResBlock(width) for _ in range(blocks))
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(width * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.pool(x).flatten(1))


def gpt_batch():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 256, (4, 16), generator=g), torch.randint(0, 256, (4, 16),
                                                                        generator=g)


def conv_batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)


def gpt_loss(model, x, y):
    return model(x, y)[1]


def conv_loss(model, x, y):
    return F.cross_entropy(model(x), y)


# ---- one step under each tool -----------------------------------------------------------------
def train_step(model, opt, loss_fn, x, y, amp=None, scaler=None, micro=1):
    """One optimizer step over ``micro`` forward/backward passes of the same batch."""
    for _ in range(micro):
        with torch.autocast("cpu", dtype=amp or torch.float32, enabled=amp is not None):
            loss = loss_fn(model, x, y)
        (scaler.scale(loss) if scaler is not None else loss / micro).backward()
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def memtop_window(tmp_path, model, opt, loss_fn, batch, amp=None, scaler=None, micro=1):
    """A Monitor with a window at step 2 (step 2 warm-up, step 3 measured): its event's data."""
    with Monitor(model, opt, scaler=scaler, run_dir=tmp_path / "runs", warmup_steps=1,
                 attribute_at=[2], listen=False, write_report=False, leak_watch=False,
                 max_steps=4) as mon:
        for _ in range(4):
            with mon.step() as s:
                s.set(loss=train_step(model, opt, loss_fn, *batch, amp=amp, scaler=scaler,
                                      micro=micro))
    assert mon.attribution.last is not None, "the window wrote no memory_attribution"
    return mon.attribution.last


def memtracker_step(model, opt, loss_fn, batch, amp=None, scaler=None):
    """MemTracker's per-module activations (each call's post- minus pre-forward), parameters,
    inputs and outputs, and its Gradient and Optstate totals, for one step."""
    mt = MemTracker()
    mt.track_external(model, opt, *batch)
    with mt:
        with torch.autocast("cpu", dtype=amp or torch.float32, enabled=amp is not None):
            loss = loss_fn(model, *batch)
        (scaler.scale(loss) if scaler is not None else loss).backward()
        grads = mt.get_tracker_snapshot("current")[CPU]["Gradient"]
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt_state = mt.get_tracker_snapshot("current")[CPU]["Optstate"]
        opt.zero_grad(set_to_none=True)
    names = {id(m): n for n, m in model.named_modules()}
    out = {}
    for module, st in mt.memory_tracking.items():
        pre = st.snapshots[_ModState.PRE_FW]
        post = st.snapshots[_ModState.POST_FW]
        acts = sum(b.get(CPU, {}).get("Activation", 0) - a.get(CPU, {}).get("Activation", 0)
                   for a, b in zip(pre, post, strict=True))
        out[names[id(module)]] = {"activations": acts, "params": st.parameter_mem,
                                  "input": st.input_mem, "output": st.output_mem}
    return out, grads, opt_state


def boundary_terms(model, loss_fn, batch, amp=None):
    """For each module, over one forward: the bytes of its inputs that autograd saves inside
    it, and of its outputs that nothing inside it saves (the rule's two terms)."""
    names = {id(m): n for n, m in model.named_modules()}
    params = {storage_key(p)[:3] for p in model.parameters()}
    stack: list[str] = []
    saved_in: dict[str, set] = {}  # module -> storages saved while it (or a child) ran
    inputs: dict[str, dict] = {}
    outputs: dict[str, dict] = {}

    def keys(obj):
        items = obj if isinstance(obj, (tuple, list)) else ()
        ts = [obj] if isinstance(obj, torch.Tensor) else [
            t for t in items if isinstance(t, torch.Tensor)]
        return {k[:3]: k[3] for k in map(storage_key, ts) if k is not None}

    def pre(mod, args):
        stack.append(names[id(mod)])
        inputs.setdefault(names[id(mod)], {}).update(keys(args))

    def post(mod, args, out):
        stack.pop()
        outputs.setdefault(names[id(mod)], {}).update(keys(out))

    def pack(t):
        k = storage_key(t)
        if k is not None and k[:3] not in params:
            for name in stack:  # every module running: the innermost and its ancestors
                saved_in.setdefault(name, set()).add(k[:3])
        return t.detach()

    handles = [h for m in model.modules() for h in (m.register_forward_pre_hook(pre),
                                                     m.register_forward_hook(post))]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast(
                "cpu", dtype=amp or torch.float32, enabled=amp is not None):
            loss_fn(model, *batch).backward()
    finally:
        for h in handles:
            h.remove()
    model.zero_grad(set_to_none=True)
    terms = {}
    for name in names.values():
        saved = saved_in.get(name, set())
        ins, outs = inputs.get(name, {}), outputs.get(name, {})
        terms[name] = (sum(b for k, b in ins.items() if k in saved),
                       sum(b for k, b in outs.items() if k not in saved and k not in ins))
    return terms


def inclusive(rows, name, key):
    prefix = f"{name}." if name else ""
    return sum(r[key] for r in rows if r["module"] == name or r["module"].startswith(prefix))


def table_top3(rows, key="activations_bytes"):
    level = choose_depth(rows)
    return [r["module"] for r in sort_rows(at_depth(rows, level), key)[:3]], level


def prepared(model_fn, loss_fn, batch_fn, amp=None, fp16_scaler=False):
    model = model_fn()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu") if fp16_scaler else None
    batch = batch_fn()
    train_step(model, opt, loss_fn, *batch, amp=amp, scaler=scaler)  # the optimizer's state
    return model, opt, scaler, batch


MODELS = {"gpt": (tiny_gpt, gpt_loss, gpt_batch), "convnet": (ConvNet, conv_loss, conv_batch)}


# ---- the checks -------------------------------------------------------------------------------
@pytest.mark.parametrize("which", sorted(MODELS))
def test_fp32_parameters_gradients_optimizer_exact_and_activations_by_the_rule(which, tmp_path):
    model_fn, loss_fn, batch_fn = MODELS[which]
    model, opt, scaler, batch = prepared(model_fn, loss_fn, batch_fn)
    data = memtop_window(tmp_path, model, opt, loss_fn, batch)
    theirs, grads, opt_state = memtracker_step(model, opt, loss_fn, batch)
    terms = boundary_terms(model, loss_fn, batch)
    rows = data["modules"]
    first_owner: dict[tuple, str] = {}
    for name, mod in model.named_modules():
        for p in mod.parameters(recurse=False):
            first_owner.setdefault(storage_key(p)[:3], name)
    for name, mt in theirs.items():
        mod = dict(model.named_modules())[name]
        shared_elsewhere = any(first_owner[storage_key(p)[:3]] != n
                               for n, sub in mod.named_modules(prefix=name)
                               for p in sub.parameters(recurse=False))
        if not shared_elsewhere:  # a tied weight is credited once, to its first module
            assert inclusive(rows, name, "params_bytes") == mt["params"], name
        ours = inclusive(rows, name, "activations_bytes") + inclusive(
            rows, name, "weight_copies_bytes")  # (unattributed: saved outside the model)
        saved_inputs, unsaved_outputs = terms[name]
        assert mt["activations"] == ours - saved_inputs + unsaved_outputs, (
            name, mt, ours, terms[name])
        if mt["input"] == mt["output"] and mt["activations"]:  # same-size in and out: agree
            assert abs(ours - mt["activations"]) <= 0.1 * mt["activations"] or \
                saved_inputs != unsaved_outputs, (name, ours, mt)
    assert data["grads_total_bytes"] == grads
    assert data["optimizer_total_bytes"] == opt_state
    assert data["params_total_bytes"] == sum(
        storage_key(p)[3] for p in {storage_key(p)[:3]: p for p in model.parameters()}.values())


@pytest.mark.parametrize("which", sorted(MODELS))
@pytest.mark.parametrize("amp", ["fp32", "bf16", "fp16"])
def test_blocks_agree_within_ten_percent_and_the_top_three_match(which, amp, tmp_path):
    """At the table's depth (blocks), with and without autocast: a block's activations within
    10% of MemTracker's, the same three modules on top; fp16 runs with GradScaler("cpu")."""
    model_fn, loss_fn, batch_fn = MODELS[which]
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[amp]
    model, opt, scaler, batch = prepared(model_fn, loss_fn, batch_fn, dtype, amp == "fp16")
    data = memtop_window(tmp_path, model, opt, loss_fn, batch, dtype, scaler)
    theirs, _, _ = memtracker_step(model, opt, loss_fn, batch, dtype, scaler)
    rows = data["modules"]
    ours_top, level = table_top3(rows)
    blocks = [r["module"] for r in at_depth(rows, level) if r["module"][-1:].isdigit()]
    assert len(blocks) == 3, blocks
    for name in blocks:
        ours = inclusive(rows, name, "activations_bytes") + inclusive(
            rows, name, "weight_copies_bytes")
        assert abs(ours - theirs[name]["activations"]) <= 0.1 * theirs[name]["activations"], (
            name, ours, theirs[name])
    mt_rows = [{"module": n, "activations_bytes": v["activations"]} for n, v in theirs.items()
               if n.count(".") + (1 if n else 0) == level or n in ours_top]
    mt_top = [r["module"] for r in sort_rows(
        [r for r in mt_rows if r["module"] and (r["module"].count(".") + 1) == level],
        "activations_bytes")[:3]]
    assert sorted(ours_top) == sorted(mt_top) == sorted(blocks)
    if amp != "fp32":
        assert data["weight_copies_bytes"] > 0  # autocast's casts of weights, kept apart


def test_gradient_accumulation_reports_one_micro_batch_and_the_accumulated_gradients(tmp_path):
    """Four micro-batches: activations are one micro-batch's (they are not alive together),
    the same as a one-micro-batch step's; gradients and optimizer state are unchanged."""
    model, opt, _, batch = prepared(tiny_gpt, gpt_loss, gpt_batch)
    one = memtop_window(tmp_path / "one", model, opt, gpt_loss, batch)
    four = memtop_window(tmp_path / "four", model, opt, gpt_loss, batch, micro=4)
    assert one["micro_batches"] == 1 and four["micro_batches"] == 4
    by_name = {r["module"]: r for r in one["modules"]}
    for row in four["modules"]:
        for key in ("activations_bytes", "grads_bytes", "optimizer_bytes", "params_bytes"):
            assert row[key] == by_name[row["module"]][key], (row["module"], key)
    assert four["activations_total_bytes"] == one["activations_total_bytes"]


class CheckpointedGPT(nn.Module):
    """The tiny GPT's forward with block 1 under torch.utils.checkpoint (non-reentrant)."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = tiny_gpt()

    def forward(self, idx, targets):
        t = self.gpt.transformer
        x = t.drop(t.wte(idx) + t.wpe(torch.arange(idx.shape[1])))
        for i, block in enumerate(t.h):
            x = checkpoint(block, x, use_reentrant=False) if i == 1 else block(x)
        logits = self.gpt.lm_head(t.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def test_a_checkpointed_block_keeps_only_its_input(tmp_path):
    plain_model, plain_opt, _, batch = prepared(tiny_gpt, gpt_loss, gpt_batch)
    plain = memtop_window(tmp_path / "plain", plain_model, plain_opt, gpt_loss, batch)
    model, opt, _, batch = prepared(CheckpointedGPT, gpt_loss, gpt_batch)
    data = memtop_window(tmp_path / "ckpt", model, opt, gpt_loss, batch)
    rows = data["modules"]
    block_input = 4 * 16 * 32 * 4  # B×T×D fp32: the residual stream entering block 1
    assert inclusive(rows, "gpt.transformer.h.1", "activations_bytes") == block_input
    assert {r["module"] for r in rows if r["checkpointed"]} == {"gpt.transformer.h.1"}
    assert data["checkpoint_inputs_bytes"] == block_input
    for i in (0, 2):  # the other blocks are as without checkpointing
        assert inclusive(rows, f"gpt.transformer.h.{i}", "activations_bytes") == inclusive(
            plain["modules"], f"transformer.h.{i}", "activations_bytes")
    # the recomputation in backward is no forward: block 1's children ran once
    assert {r["calls"] for r in rows if r["module"].startswith("gpt.transformer.h.1.")} == {1}
    assert inclusive(rows, "gpt.transformer.h.1", "grads_bytes") == inclusive(
        plain["modules"], "transformer.h.1", "grads_bytes")
