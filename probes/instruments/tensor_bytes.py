"""Bytes of tensors counted by storage, for the memory ledger (probes/instruments/ledger.py):
views and tied weights count once (GPT ties wte and lm_head: one storage), and a
``saved_tensors_hooks`` meter records what autograd keeps for backward on a sampled step. The
pack hook records storage pointer and size and returns ``t.detach()`` (same storage; as the
docs advise: returning ``t`` itself ties a saved output to its own grad_fn, a cycle that even gc
does not free, as tests/unit/test_ledger.py shows).
"""

from __future__ import annotations

import time
from typing import Any

import torch

# softmax's backward nodes: F.softmax's, and the masked ("safe") softmax that SDPA's math path
# runs when it cannot fuse (an explicit attention mask: Hugging Face GPT-2's default on CPU
# saves its (B, heads, T, T) weights through it, T² memory the ledger must call scores)
_SOFTMAX_FNS = ("SoftmaxBackward", "SafeSoftmaxBackward")
_VIEW_FNS = {"TBackward0", "ViewBackward0", "TransposeBackward0", "PermuteBackward0",
             "UnsafeViewBackward0", "ExpandBackward0", "ReshapeAliasBackward0"}


def storage_key(t: torch.Tensor) -> tuple[str, int | None, int, int] | None:
    """(device type, index, storage pointer, storage bytes); None for storage-less tensors."""
    try:
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        ptr = storage.data_ptr()
    except (RuntimeError, NotImplementedError):  # sparse, meta, functional wrappers
        return None
    if nbytes == 0:
        return None
    return t.device.type, t.device.index, ptr, nbytes


def tensors_in(args: Any) -> list[torch.Tensor]:
    """The tensors in a module call's arguments (nested tuples, lists and dicts)."""
    if isinstance(args, torch.Tensor):
        return [args]
    if isinstance(args, (tuple, list)):
        return [t for a in args for t in tensors_in(a)]
    if isinstance(args, dict):
        return [t for a in args.values() for t in tensors_in(a)]
    return []


def unique_bytes(tensors: Any) -> tuple[int, set[tuple]]:
    """Bytes of the distinct storages behind ``tensors`` (views and tied weights counted once)."""
    seen: dict[tuple, int] = {}
    for t in tensors:
        k = storage_key(t)
        if k is not None:
            seen[k[:3]] = k[3]
    return sum(seen.values()), set(seen)


def classify(t: torch.Tensor) -> str:
    """'weight' for an autocast cast of a leaf parameter, 'scores' for a softmax T×T output
    (F.softmax's or SDPA's masked softmax)."""
    fn = t.grad_fn
    for _ in range(3):
        if fn is None:
            return "activation"
        name = type(fn).__name__
        if name.startswith("ToCopyBackward"):
            nxt = fn.next_functions[0][0] if fn.next_functions else None
            if nxt is not None and type(nxt).__name__ == "AccumulateGrad":
                return "weight"
            if nxt is not None and type(nxt).__name__.startswith(_SOFTMAX_FNS):
                return "scores" if t.dim() == 4 and t.shape[-1] == t.shape[-2] else "activation"
            return "activation"
        if name.startswith(_SOFTMAX_FNS):
            return "scores" if t.dim() == 4 and t.shape[-1] == t.shape[-2] else "activation"
        if name not in _VIEW_FNS:
            return "activation"
        fn = fn.next_functions[0][0] if fn.next_functions else None
    return "activation"


class SavedTensorMeter:
    """Records what autograd saves for backward inside ``with meter:``; keeps no tensor alive.

    ``exclude`` holds storage keys already counted elsewhere (parameters, buffers).
    """

    def __init__(self, exclude: set[tuple] | None = None) -> None:
        self.exclude = exclude or set()
        self.bytes_by_kind: dict[str, int] = {"activation": 0, "weight": 0, "scores": 0}
        self.tensors = 0
        self.hook_s = 0.0
        self._seen: set[tuple] = set()
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    @property
    def activation_bytes(self) -> int:
        """Saved activations, attention scores included, autocast weight copies not."""
        return self.bytes_by_kind["activation"] + self.bytes_by_kind["scores"]

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        self.tensors += 1
        k = storage_key(t)
        if k is not None and k[:3] not in self.exclude and k[:3] not in self._seen:
            self._seen.add(k[:3])
            try:
                kind = classify(t)
            except Exception:  # an odd grad_fn must never break the training step
                kind = "activation"
            self.bytes_by_kind[kind] += k[3]
        self.hook_s += time.perf_counter() - t0
        return t.detach()  # same storage, no grad_fn: no reference cycle, nothing kept by us

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def __enter__(self) -> SavedTensorMeter:
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)
