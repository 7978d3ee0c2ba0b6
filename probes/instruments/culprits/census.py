"""What is alive at one look: tensors by group, and the hooks on each named submodule.

One ``gc.get_objects()`` scan with a type check per object (about 0.1 s per million objects;
benchmarks/cases/leaks/), done only when the finder looks, never per step. The census
keeps ids and group keys, not the tensors: holding them would be a leak of its own.
"""

from __future__ import annotations

import gc
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
              "_backward_pre_hooks", "_state_dict_hooks", "_load_state_dict_pre_hooks")


@dataclass(frozen=True)
class TensorGroup:
    """Tensors that look alike: the unit the finder counts and names."""

    shape: tuple[int, ...]
    dtype: str
    device: str
    requires_grad: bool
    grad_fn: str | None  # the autograd node's class name: a graph is kept with the tensor

    def label(self) -> str:
        shape = "×".join(str(n) for n in self.shape) or "scalar"
        grad = f", grad_fn={self.grad_fn}" if self.grad_fn else ""
        return f"{shape} {self.dtype} on {self.device}{grad}"


@dataclass
class Census:
    """One look: group -> ids of its live tensors, bytes per group, hook counts per module."""

    step: int
    objects_scanned: int
    ids: dict[TensorGroup, set[int]] = field(default_factory=dict)
    bytes_by_group: Counter[TensorGroup] = field(default_factory=Counter)
    hooks: dict[str, int] = field(default_factory=dict)  # "model.fc forward_hooks" -> count
    samples: dict[TensorGroup, list[torch.Tensor]] = field(default_factory=dict)  # born since

    def release(self) -> None:
        """Drop the sampled tensors (the walk is done with them)."""
        self.samples.clear()


def group_of(t: torch.Tensor) -> TensorGroup:
    fn = t.grad_fn
    return TensorGroup(tuple(t.shape), str(t.dtype).removeprefix("torch."), str(t.device),
                       bool(t.requires_grad), type(fn).__name__ if fn is not None else None)


def tensor_bytes(t: torch.Tensor) -> int:
    try:
        return int(t.numel()) * int(t.element_size())
    except (RuntimeError, TypeError):  # a meta, sparse or wrapper tensor without plain storage
        return 0


def take_census(step: int, model: torch.nn.Module | None, before: Census | None = None,
                sample_per_group: int = 3) -> Census:
    """Every live tensor (gc-tracked: all Python-visible ones), grouped, and the hooks; with
    ``before``, up to ``sample_per_group`` tensors per group born since that look are kept in
    ``samples`` for the referrer walk (``release()`` drops them)."""
    census = Census(step, 0)
    is_tensor: dict[type, bool] = {}  # type() check: isinstance would read a proxy's __class__
    objects = gc.get_objects()
    census.objects_scanned = len(objects)
    for obj in objects:
        tp = type(obj)
        flag = is_tensor.get(tp)
        if flag is None:
            flag = is_tensor[tp] = issubclass(tp, torch.Tensor)
        if flag:
            try:
                key = group_of(obj)
            except Exception:  # a tensor subclass whose attributes raise
                continue
            census.ids.setdefault(key, set()).add(id(obj))
            census.bytes_by_group[key] += tensor_bytes(obj)
            if before is not None and id(obj) not in before.ids.get(key, ()):
                kept = census.samples.setdefault(key, [])
                if len(kept) < sample_per_group:
                    kept.append(obj)
    del objects, obj
    census.hooks = hook_counts(model)
    return census


def hook_counts(model: torch.nn.Module | None) -> dict[str, int]:
    """"model.fc forward_hooks" -> how many are registered: len() of a few dicts per module."""
    counts: dict[str, int] = {}
    if model is None:
        return counts
    for name, module in model.named_modules(prefix="model"):
        for attr in HOOK_DICTS:
            hooks = getattr(module, attr, None)
            if hooks:
                counts[f"{name} {attr.strip('_')}"] = len(hooks)
    return counts


def hook_functions(model: torch.nn.Module | None, key: str) -> list[Any]:
    """The hooks registered under ``key`` ("model.fc forward_hooks"), oldest first."""
    if model is None:
        return []
    name, _, attr = key.rpartition(" ")
    for mod_name, module in model.named_modules(prefix="model"):
        if mod_name == name:
            return list(getattr(module, f"_{attr}", {}).values())
    return []
