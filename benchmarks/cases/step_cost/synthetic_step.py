"""Synthetic training steps of a chosen length, for judging memtop's per-step cost at GPU speed
on a CPU (issue 28): a few-ms GPU step is what makes a fixed cost of host time matter, and a CPU
matmul sized to the same length puts memtop's work beside the same amount of step time.

A step is real torch work: forward of a square Linear over a square batch, backward, SGD,
``loss.item()`` (plain) or ``s.set(loss=loss)`` (monitored). ``calibrate`` sizes it.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from benchmarks.harness import units_per_s
from probes import Monitor


class SyntheticStep:
    """A square Linear whose step takes about ``target_ms`` here, with a Monitor over it."""

    def __init__(self, target_ms: float, run_dir: str) -> None:
        self.target_ms = target_ms
        self.dim = calibrate(target_ms)
        torch.manual_seed(0)
        self.model = nn.Linear(self.dim, self.dim)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(self.dim, self.dim)
        self.monitor = Monitor(self.model, self.optimizer, run_dir=run_dir, write_report=False,
                               samples_per_step=self.dim)
        self.step_ms = measure_ms(self.model, self.optimizer, self.x)
        self.units = self.dim  # samples per step

    def plain_step(self) -> None:
        plain_step(self.model, self.optimizer, self.x)

    def monitored_step(self) -> None:
        with self.monitor.step() as s:
            loss = self.model(self.x).square().mean()
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            s.set(loss=loss)

    def block(self, monitored: bool, steps: int) -> float:
        """``steps`` steps one way; samples per second."""
        return units_per_s(self.monitored_step if monitored else self.plain_step, steps,
                           self.units)


def plain_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    """Forward, backward, SGD, the loss read: the step without memtop."""
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    loss.item()


def measure_ms(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
               steps: int = 7) -> float:
    """Median wall time of one plain step, in ms."""
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        plain_step(model, optimizer, x)
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def calibrate(target_ms: float, rounds: int = 4) -> int:
    """The Linear's size whose plain step takes about ``target_ms``: a step is ~3 matmuls of
    dim³, so the size is scaled by the cube root of the time ratio, a few times over."""
    dim = 64
    for _ in range(rounds):
        model = nn.Linear(dim, dim)
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        got = measure_ms(model, opt, torch.randn(dim, dim))
        dim = max(8, int(round(dim * (target_ms / max(got, 1e-3)) ** (1 / 3))))
    return dim
