"""Per-module memory of one training step: the hooks a memory attribution window
(probes/instruments/attribution.py) puts on a model for a step and takes off at its end.

What each figure is, and why it is measured so (docs/ATTRIBUTION.md):
- activations: every tensor autograd saves for backward, seen by a
  ``torch.autograd.graph.saved_tensors_hooks`` pack hook, counted once per storage and credited
  to the innermost module whose forward is running when it is saved (a stack kept by forward
  pre- and post-hooks); parameters and buffers saved are not activations; an autocast cast of a
  parameter is a weight copy (``weight_copies_bytes``), T×T softmax outputs are also
  ``scores_bytes``. Saved outside any module of the model: unattributed.
- a module whose forward runs under another saved-tensor hook (``torch.utils.checkpoint``'s):
  autograd saves nothing through ours there; what the checkpoint keeps are the inputs of the
  outermost such module, credited to it as its activations (``checkpointed``; the
  non-reentrant checkpoint saves them through our hook just before, as its caller's: they move).
- micro-batches: a forward that starts after a backward starts a new pass; a step's
  activations are its largest pass (passes are not alive together), a module called twice in
  one pass is one row with both calls' bytes.
- forward peak: the high-water mark inside the module above its entry. CUDA: the allocator's
  peak, reset at each hook (exact). CPU: the heap counter memtop reads (mallinfo2, ~1-10 µs),
  sampled at every module entry and exit and at every saved tensor (a sampled peak). Reads
  have a budget (``plan_reads``): on a model whose reads would cost more than a share of a
  step (10,000 modules, a fragmented heap), only modules down to a depth are read, the rest
  say n/a.
- gradients: each parameter's .grad when autograd accumulates it; optimizer state: the
  optimizer's real state tensors after its step; parameters: direct parameters of each module,
  a parameter shared by several credited once, to the first module ``named_modules`` gives.
Backward re-running a forward (checkpointing) is not a forward: its hooks count nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from probes.counters.memory import heap_counters
from probes.instruments.tensor_bytes import classify, storage_key, tensors_in, unique_bytes

_in_backward: Callable[[], int] = torch._C._current_graph_task_id  # -1 outside backward
_top_hooks: Callable[[bool], Any] = torch._C._autograd._top_saved_tensors_default_hooks


@dataclass
class ModuleFigures:
    """One module's figures for one pass (activations) or step (the rest)."""

    activations: int = 0
    weight_copies: int = 0
    scores: int = 0
    checkpointed: bool = False


@dataclass
class _Frame:
    name: str
    entry: int | None  # the counter at the module's entry (None: not read, over the budget)
    high: int  # the highest reading since
    t0: float
    foreign: bool  # another saved-tensor hook (a checkpoint) is on top


@dataclass
class StepFigures:
    """What the meter measured over one step (the window keeps them per step)."""

    modules: dict[str, ModuleFigures]  # the largest pass's activations, per module
    unattributed: int
    passes: int
    peaks: dict[str, int]  # modules read (the budget's depth): the others have none
    calls: dict[str, int]
    inputs: dict[str, int]
    forward_s: dict[str, float]
    grads: dict[str, int]
    optimizer: dict[str, int]
    step_high: int | None  # the highest counter reading of the step (a peak)
    hook_s: float


class PeakReader:
    """The forward-peak counter: ``read()`` -> (now, highest since the last read)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.sampled = not self.cuda
        self.source = ("CUDA allocator (max_memory_allocated, reset at each module hook)"
                       if self.cuda else "heap in use (mallinfo2), sampled at module "
                                         "entries, exits and saved tensors")

    def read_cost_s(self, reads: int = 8) -> float:
        """One read's cost now, for the read budget (a few reads timed)."""
        t0 = time.perf_counter()
        for _ in range(reads):
            self.read()
        return (time.perf_counter() - t0) / reads

    def read(self) -> tuple[int, int] | None:
        if self.cuda:  # the nested dict: memory_stats() flattens ~120 keys in Python besides
            stats = torch.cuda.memory_stats_as_nested_dict(self.device)["allocated_bytes"]
            torch.cuda.reset_peak_memory_stats(self.device)
            return int(stats["all"]["current"]), int(stats["all"]["peak"])
        heap = heap_counters()
        return (heap[0], heap[0]) if heap is not None else None


@dataclass
class ModuleMeter:
    """Installs on ``model`` for one step (``install``/``remove``; ``saving()`` is the step's
    saved-tensor context) and hands its figures over (``take``). Never raises into the step:
    a failure of its own is kept in ``error`` and the step goes on uncounted."""

    model: torch.nn.Module
    optimizer: Any
    reader: PeakReader
    names: dict[int, str] = field(default_factory=dict)
    owner: dict[tuple, str] = field(default_factory=dict)  # parameter storage -> module
    param_bytes: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    peak_depth: int | None = None  # read modules down to this depth (None: all)
    read_packs: bool = True  # CPU: also read at each saved tensor

    def __post_init__(self) -> None:
        self._handles: list[Any] = []
        self._read_names: set[str] | None = None  # modules read (None: all)
        self._param_keys: set[tuple] = set()
        self._param_owner: dict[int, str] = {}  # id(parameter) -> module
        for name, module in self.model.named_modules():  # a shared module: its first name
            self.names[id(module)] = name
            for p in module.parameters(recurse=False):
                key = storage_key(p)
                if key is None or key[:3] in self.owner:
                    continue
                self.owner[key[:3]] = name
                self._param_owner[id(p)] = name
                self.param_bytes[name] = self.param_bytes.get(name, 0) + key[3]
        for t in (*self.model.parameters(), *self.model.buffers()):
            key = storage_key(t)
            if key is not None:
                self._param_keys.add(key[:3])
        self._pack_fn = self._pack
        self._below_pack: Callable[[torch.Tensor], Any] | None = None
        self._reset()

    @property
    def modules_hooked(self) -> int:
        return len(self.names)

    def plan_reads(self, read_s: float, budget_s: float) -> None:
        """Read the peak counter at as many modules as ``budget_s`` a step allows at
        ``read_s`` a read (two per module call, one per saved tensor): the shallowest modules
        first; the model itself always (two reads a step)."""
        per_depth: dict[int, int] = {}
        for name in set(self.names.values()):
            d = 0 if not name else name.count(".") + 1
            per_depth[d] = per_depth.get(d, 0) + 1
        allowed = budget_s / max(read_s, 1e-9)
        depths = sorted(per_depth)
        cost, fits = 0.0, 0
        for d in depths:
            cost += 2 * per_depth[d]
            if cost > allowed and d > 0:
                break
            fits = d
        everything = fits == depths[-1]
        self.peak_depth = None if everything else fits
        self.read_packs = self.reader.sampled and everything and \
            cost + len(self.names) <= allowed  # ~one saved tensor per module
        self._read_names = None if everything else {
            n for n in self.names.values() if (0 if not n else n.count(".") + 1) <= fits}

    # the step ----------------------------------------------------------------------------
    def _reset(self) -> None:
        self._stack: list[_Frame | None] = []
        self._pass: dict[str, ModuleFigures] = {}
        self._pass_unattributed = 0
        self._pass_seen: set[tuple] = set()
        self._pass_where: dict[tuple, str | None] = {}  # a storage -> the module credited
        self._passes: list[tuple[int, dict[str, ModuleFigures], int]] = []
        self._backward_seen = False
        self._peaks: dict[str, int] = {}
        self._calls: dict[str, int] = {}
        self._inputs: dict[str, int] = {}
        self._forward_s: dict[str, float] = {}
        self._grads: dict[str, int] = {}
        self._grad_seen: set[int] = set()
        self._step_high: int | None = None
        self._hook_s = 0.0

    def install(self) -> None:
        """Hooks on every module and parameter; ``remove()`` takes every one off."""
        self._reset()
        pre, post = self._pre, self._post
        seen: set[int] = set()
        for module in self.model.modules():
            if id(module) in seen:
                continue
            seen.add(id(module))
            self._handles.append(module.register_forward_pre_hook(pre))
            self._handles.append(module.register_forward_hook(post, always_call=True))
        for p in self.model.parameters():
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(self._on_grad))

    def remove(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self._stack.clear()

    @property
    def installed(self) -> bool:
        return bool(self._handles)

    def saving(self) -> torch.autograd.graph.saved_tensors_hooks:
        """The step's saved-tensor hooks (enter around forward and backward). A loop's own
        hooks already in place (``save_on_cpu``, offloading) are chained, not shadowed: what
        they do to a saved tensor, they still do."""
        below = _top_hooks(False)
        self._below_pack = below[0] if below is not None else None
        unpack = below[1] if below is not None else _unpack
        return torch.autograd.graph.saved_tensors_hooks(self._pack_fn, unpack)

    def take(self) -> StepFigures:
        """The step's figures (after its optimizer step: the state is read now)."""
        self._close_pass()
        best = max(self._passes, key=lambda p: p[0], default=(0, {}, 0))
        return StepFigures(
            modules=best[1], unattributed=best[2], passes=len(self._passes),
            peaks=dict(self._peaks), calls=dict(self._calls), inputs=dict(self._inputs),
            forward_s=dict(self._forward_s), grads=dict(self._grads),
            optimizer=self._optimizer_state(), step_high=self._step_high,
            hook_s=self._hook_s)

    # hooks ---------------------------------------------------------------------------------
    def _read(self, frame: _Frame | None) -> int | None:
        reading = self.reader.read()
        if reading is None:
            return None
        now, high = reading
        if frame is not None and high > frame.high:
            frame.high = high
        if self._step_high is None or high > self._step_high:
            self._step_high = high
        return now

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if _in_backward() != -1:  # a checkpoint's recomputation, not a forward
            self._stack.append(None)
            return
        t0 = time.perf_counter()
        try:
            stack = self._stack
            if not stack and self._backward_seen:  # a new micro-batch's forward
                self._close_pass()
            parent = stack[-1] if stack else None
            name = self.names.get(id(module), "?")
            reads = self._read_names is None or name in self._read_names
            now = self._read(parent) if reads else None
            top = _top_hooks(False)
            foreign = top is not None and top[0] != self._pack_fn
            if foreign and not (parent is not None and parent.foreign):
                self._keep_inputs(name, parent.name if parent else None, args)
            nbytes = unique_bytes(tensors_in(args))[0]
            if nbytes > self._inputs.get(name, 0):
                self._inputs[name] = nbytes
            stack.append(_Frame(name, now, now or 0, t0, foreign))
        except Exception as exc:  # never into the step: count nothing more
            self.error = self.error or f"{type(exc).__name__}: {exc}"
            self._stack.append(None)
        self._hook_s += time.perf_counter() - t0

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if not self._stack:
            return
        frame = self._stack.pop()
        if frame is None:
            return
        t0 = time.perf_counter()
        try:
            name = frame.name
            self._forward_s[name] = self._forward_s.get(name, 0.0) + (t0 - frame.t0)
            self._calls[name] = self._calls.get(name, 0) + 1
            if frame.entry is not None:
                self._read(frame)
                peak = max(0, frame.high - frame.entry)
                if peak > self._peaks.get(name, -1):
                    self._peaks[name] = peak
            parent = self._stack[-1] if self._stack else None
            if parent is not None and frame.high > parent.high:
                parent.high = frame.high
        except Exception as exc:
            self.error = self.error or f"{type(exc).__name__}: {exc}"
        self._hook_s += time.perf_counter() - t0

    def _pack(self, t: torch.Tensor) -> Any:
        t0 = time.perf_counter()
        try:
            if _in_backward() == -1:
                key = storage_key(t)
                if key is not None and key[:3] not in self._param_keys \
                        and key[:3] not in self._pass_seen:
                    self._pass_seen.add(key[:3])
                    frame = self._stack[-1] if self._stack else None
                    if frame is None:
                        self._pass_unattributed += key[3]
                        self._pass_where[key[:3]] = None
                    else:
                        figures = self._pass.setdefault(frame.name, ModuleFigures())
                        kind = classify(t)
                        if kind == "weight":
                            figures.weight_copies += key[3]
                        else:
                            figures.activations += key[3]
                            self._pass_where[key[:3]] = frame.name
                            if kind == "scores":
                                figures.scores += key[3]
                        if self.read_packs:
                            self._read(frame)
        except Exception as exc:
            self.error = self.error or f"{type(exc).__name__}: {exc}"
        self._hook_s += time.perf_counter() - t0
        if self._below_pack is not None:
            return self._below_pack(t)
        return t.detach()  # same storage, no grad_fn: no cycle, nothing kept by the meter

    def _keep_inputs(self, name: str, caller: str | None, args: Any) -> None:
        """A checkpoint keeps this module's inputs: credit them to it, moving any that the
        checkpoint saved as its caller's a moment ago."""
        figures = self._pass.setdefault(name, ModuleFigures())
        figures.checkpointed = True
        for t in tensors_in(args):
            key = storage_key(t)
            if key is None or key[:3] in self._param_keys:
                continue
            k = key[:3]
            if k in self._pass_seen:
                if k not in self._pass_where or self._pass_where[k] != caller:
                    continue  # saved by another module: it stays there
                if caller is None:
                    self._pass_unattributed -= key[3]
                else:
                    self._pass[caller].activations -= key[3]
            self._pass_seen.add(k)
            self._pass_where[k] = name
            figures.activations += key[3]

    def _on_grad(self, p: torch.Tensor) -> None:
        self._backward_seen = True
        grad = p.grad
        if grad is None or id(p) in self._grad_seen:
            return
        self._grad_seen.add(id(p))
        name = self._param_owner.get(id(p))
        if name is not None:
            self._grads[name] = self._grads.get(name, 0) + grad.numel() * grad.element_size()

    def _close_pass(self) -> None:
        if self._pass or self._pass_unattributed:
            total = self._pass_unattributed + sum(f.activations + f.weight_copies
                                                  for f in self._pass.values())
            self._passes.append((total, self._pass, self._pass_unattributed))
        self._pass, self._pass_unattributed, self._pass_seen = {}, 0, set()
        self._pass_where = {}
        self._backward_seen = False

    def _optimizer_state(self) -> dict[str, int]:
        """The optimizer's state tensors per owning module, each storage once; fp32 master
        copies are left out, as the ledger does (probes/instruments/ledger.py)."""
        out: dict[str, int] = {}
        seen: set[tuple] = set()
        state = getattr(self.optimizer, "state", {}) or {}
        for p, per_param in state.items():
            name = self._param_owner.get(id(p))
            if name is None or not isinstance(per_param, dict):
                continue
            for key_name, value in per_param.items():
                if not isinstance(value, torch.Tensor) or "master" in str(key_name).lower():
                    continue
                key = storage_key(value)
                if key is not None and key[:3] not in seen:
                    seen.add(key[:3])
                    out[name] = out.get(name, 0) + key[3]
        return out


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t
