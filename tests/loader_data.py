"""Datasets and a tiny loop for the DataLoader workers' tests (tests/integration/test_workers.py).
A module of its own, importable by name, so a spawn-started worker can unpickle them without
importing a test module; torch only. (The workers' benchmark,
benchmarks/cases/step_cost/workers_sampler.py, feeds memtop's GPT token windows of its own.)"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset, get_worker_info

FEATURES = 8
BATCH = 16
LEAK_BYTES = 512 * 1024  # per item: the dataset cache


class Items(Dataset):
    """``n`` small items; with ``leak_bytes``, each worker keeps that many bytes per item it
    returns (a cache in ``__getitem__``, as the issue's loop did); with ``shared``, every item
    reads a big tensor made by the trainer (read-only: forked workers share its pages)."""

    def __init__(self, n: int = 1_000_000, leak_bytes: int = 0,
                 shared: torch.Tensor | None = None) -> None:
        self.n, self.leak_bytes, self.shared = n, leak_bytes, shared
        self.cache: dict[int, bytearray] = {}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.leak_bytes:
            self.cache[i] = bytearray(self.leak_bytes)  # touched: resident, the worker's own
        x = torch.full((FEATURES,), float(i % 7))
        if self.shared is not None:
            x += float(self.shared[i % self.shared.numel()])
        return x, torch.tensor(i % 2)


def touch_shared(worker_id: int) -> None:
    """worker_init_fn: read every page of the dataset's shared tensor (no write)."""
    info = get_worker_info()
    assert info is not None
    float(info.dataset.shared.sum())


def tiny_model() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Linear(FEATURES, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor) -> torch.Tensor:
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss
