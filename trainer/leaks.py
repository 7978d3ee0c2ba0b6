"""Real leaks for the demo: mistakes the tutorial warns about, done on purpose and undone on cue.

- graph:  ``losses.append(loss)`` keeps every step's autograd graph (and its saved activations'
          bookkeeping) alive; the fix is ``loss.item()`` or ``loss.detach()``. On CUDA the
          backward also keeps the graph (``retain_graph=True``, the usual way a loop ends up
          keeping graphs: to backward through one twice), so the graph kept each step still
          holds its saved activations on the device, as real graph leaks do there; after an
          ordinary backward a kept loss holds ~512 B of device memory and ~150 KiB of host
          heap, and a demo that grows by that little is silent within 10 steps (issue 45).
- logits: keeps each step's logits tensor on the device; the fix is to move what you keep off the
          device (``.cpu()``) or not keep it.
"""

from __future__ import annotations

import torch

from trainer.choices import LEAK_KINDS

LEAK_HINTS = {
    "graph": "a tensor that still holds its autograd graph is kept each step "
             "(e.g. losses.append(loss)); log loss.item() or keep loss.detach()",
    "logits": "a device tensor is kept each step (e.g. outputs appended to a list); "
              "move it off the device with .cpu() or drop it",
}
RETAINED_GRAPH_HINT = ("a loss is kept each step with its graph retained "
                       "(loss.backward(retain_graph=True); losses.append(loss)): its saved "
                       "activations stay on the device; log loss.item(), keep loss.detach(), "
                       "and drop retain_graph")


def leak_hint(kind: str, device_type: str) -> str:
    """What the demo of ``kind`` does, as its leak_demo_started event says it."""
    if kind == "graph" and device_type == "cuda":
        return RETAINED_GRAPH_HINT
    return LEAK_HINTS[kind]


class LeakInjector:
    """Keeps references on purpose while active; ``stop()`` drops them all (the fix)."""

    def __init__(self, kind: str, device_type: str = "cpu") -> None:
        if kind not in LEAK_KINDS:
            raise ValueError(f"unknown leak kind {kind!r}; use one of {', '.join(LEAK_KINDS)}")
        self.kind = kind
        self.device_type = device_type
        self.active = False
        self.kept: list[torch.Tensor] = []
        self.started_at: int | None = None

    @property
    def retain_graph(self) -> bool:
        """The loop's backward keeps its graph this step (the graph demo on CUDA, while on)."""
        return self.active and self.kind == "graph" and self.device_type == "cuda"

    @property
    def hint(self) -> str:
        return leak_hint(self.kind, self.device_type)

    def start(self, step: int) -> None:
        self.active = True
        self.started_at = step

    def stop(self) -> int:
        """Stop leaking and release what was kept; returns how many tensors were dropped."""
        dropped = len(self.kept)
        self.active = False
        self.kept = []
        self.started_at = None
        return dropped

    def keep(self, loss: torch.Tensor, logits: torch.Tensor) -> None:
        """Called once per step with the step's live tensors, before they go out of scope."""
        if not self.active:
            return
        if self.kind == "graph":
            self.kept.append(loss)  # the loss still references its whole backward graph
        else:
            self.kept.append(logits.detach())  # (B, T, vocab) stays on the device
