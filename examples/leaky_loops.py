"""Five leaks and two healthy loops, each written with probes.Monitor as a new user would:
what memtop's culprit finder must name (and what it must leave alone).

    python examples/leaky_loops.py --loop graph --steps 60 --run-dir runs   # then:
    memtop view runs          # the leak banner, then "who holds memory": the holder's name

Loops: graph (losses.append(loss)), logits (outputs kept), hook (a forward hook registered
every step), host (64 KiB of Python bytes kept per step), cycles (gc off, reference cycles
holding tensors); healthy: ema (a deepcopy of the model made once, updated each step), buffer
(a buffer filled for 10 of every 20 steps, then emptied).
"""

from __future__ import annotations

import argparse
import copy
import gc
import sys
from pathlib import Path

import torch
from torch import nn

from probes import Monitor  # memtop

LOOPS = ("graph", "logits", "hook", "host", "cycles", "ema", "buffer")
HEALTHY = ("ema", "buffer")

losses: list[torch.Tensor] = []  # the graph leak's list: each loss keeps its graph
kept_outputs: list[torch.Tensor] = []  # the logits leak's list
hook_outputs: list[torch.Tensor] = []  # what the piled-up hooks keep
kept_bytes: list[bytearray] = []  # the host leak's list


class Net(nn.Module):
    """``depth`` hidden blocks between two layers: a deep graph has many autograd nodes."""

    def __init__(self, width: int = 256, depth: int = 0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.fc2 = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(x))
        for block in self.blocks:
            x = x + torch.tanh(block(x))
        return self.fc2(x)


class Node:
    """A node of a reference cycle (the cycles leak)."""

    def __init__(self) -> None:
        self.peer: Node | None = None
        self.saved: torch.Tensor | None = None


def keep_output(module: nn.Module, inputs: object, output: torch.Tensor) -> None:
    hook_outputs.append(output.detach())


def release() -> None:
    """Drop what the leaks kept (the module's lists outlive a run: a caller running loops one
    after another, as the GPU claims do, frees each run's tensors with this)."""
    for kept in (losses, kept_outputs, hook_outputs, kept_bytes):
        kept.clear()


def train(loop: str, steps: int = 60, run_dir: str | Path = "runs", batch: int = 128,
          device: str = "cpu", **monitor_options: object) -> Path:
    """One run of ``loop``; returns its run folder."""
    if loop not in LOOPS:
        raise ValueError(f"unknown loop {loop!r}; use one of {', '.join(LOOPS)}")
    torch.manual_seed(0)
    model = Net(depth=96 if loop == "graph" else 0).to(device)  # a kept loss: its graph
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gc_was_on = gc.isenabled()
    release()
    buffer: list[torch.Tensor] = []
    with Monitor(model, opt, run_dir=run_dir, samples_per_step=batch,
                 **monitor_options) as mon:  # type: ignore[arg-type]
        ema = copy.deepcopy(model) if loop == "ema" else None
        if loop == "cycles":
            gc.disable()
        try:
            for step in range(1, steps + 1):
                with mon.step() as s:
                    x = torch.randn(batch, 256, device=device)
                    if loop == "hook":
                        model.fc2.register_forward_hook(keep_output)  # the leak: every step
                    out = model(x)
                    loss = out.pow(2).mean()
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    s.set(loss=loss, output=out)
                if loop == "graph":
                    losses.append(loss)  # the leak: keeps each step's graph
                elif loop == "logits":
                    kept_outputs.append(out.detach())  # the leak: a tensor a step
                elif loop == "host":
                    kept_bytes.append(bytearray(64 * 1024))  # the leak: host bytes
                elif loop == "cycles":
                    a, b = Node(), Node()
                    a.peer, b.peer = b, a
                    a.saved = out.detach().clone()  # the leak: unreachable with gc off
                    del a, b
                elif loop == "ema" and ema is not None:
                    with torch.no_grad():
                        for pe, pm in zip(ema.parameters(), model.parameters(), strict=True):
                            pe.lerp_(pm, 0.01)
                        ema(x)
                elif loop == "buffer":
                    if (step - 1) % 20 < 10:
                        buffer.append(out.detach().clone())
                    else:
                        buffer.clear()
                if mon.should_stop:
                    break
        finally:
            if gc_was_on:
                gc.enable()
    return mon.run_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=LOOPS, default="graph")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--run-dir", default="runs")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.steps < 1:
        print("--steps must be at least 1", file=sys.stderr)
        return 2
    print(train(args.loop, args.steps, args.run_dir, device=args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
