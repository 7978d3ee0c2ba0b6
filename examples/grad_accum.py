"""Gradient accumulation, watched by memtop: several micro-batches per optimizer step.

    python examples/grad_accum.py --steps 30 --micro-batches 4 --run-dir runs
    memtop view runs

memtop counts optimizer steps, not micro-batches: the whole accumulation sits inside one
`mon.step()`, so step time, tokens/s and the peak cover all micro-batches of a step, and each row
records how many forward passes it saw (`micro_batches`). The model returns an output object, as
many libraries do; the loop hands its loss over with `step.set(loss=...)`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import torch
from torch import nn

from probes import Monitor  # memtop
from probes.records.errors import MemtopError  # memtop


@dataclass
class LMOutput:
    logits: torch.Tensor  # (B, T, vocab)
    loss: torch.Tensor  # mean cross-entropy over the B×T next tokens


class TinyGRULM(nn.Module):
    """A next-token model: embedding, one GRU layer, a linear head."""

    def __init__(self, vocab: int = 64, dim: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.gru = nn.GRU(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> LMOutput:
        h, _ = self.gru(self.embed(idx))                      # (B, T, dim)
        logits = self.head(h)                                 # (B, T, vocab)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return LMOutput(logits, loss)


def batches(batch_size: int, seq_len: int, vocab: int = 64, seed: int = 0):
    """Endless (input, target) pairs from a repeating pattern with noise: learnable."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        start = torch.randint(0, vocab, (batch_size, 1), generator=gen)
        seq = (start + 3 * torch.arange(seq_len + 1)) % vocab   # (B, T+1)
        noise = torch.rand(seq.shape, generator=gen) < 0.1
        seq = torch.where(noise, torch.randint(0, vocab, seq.shape, generator=gen), seq)
        yield seq[:, :-1], seq[:, 1:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Gradient accumulation instrumented with memtop.")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps (default: 30)")
    p.add_argument("--micro-batches", type=int, default=4,
                   help="micro-batches per optimizer step (default: 4)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per micro-batch (8)")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per sequence (default: 64)")
    p.add_argument("--run-dir", default="runs", help="folder for run folders (default: runs)")
    args = p.parse_args(argv)
    if min(args.steps, args.micro_batches, args.batch_size, args.seq_len) < 1:
        p.error("--steps, --micro-batches, --batch-size and --seq-len must be at least 1")

    torch.manual_seed(0)
    model = TinyGRULM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = batches(args.batch_size, args.seq_len)
    tokens = args.micro_batches * args.batch_size * args.seq_len  # per optimizer step
    try:
        mon = Monitor(model, optimizer, tokens_per_step=tokens, run_dir=args.run_dir,  # memtop
                      max_steps=args.steps, config=vars(args))
    except MemtopError as err:
        print(f"grad_accum: {err}", file=sys.stderr)
        return 2
    print(f"grad_accum: writing {mon.run_dir}; follow it with: memtop view {mon.run_dir}")
    with mon:                                                              # memtop
        for _ in range(args.steps):
            with mon.step() as step:                                       # memtop
                total = torch.zeros(())
                for _ in range(args.micro_batches):
                    x, y = next(data)
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        out = model(x, y)
                    (out.loss / args.micro_batches).backward()  # grads add up across micro-batches
                    total += out.loss.detach() / args.micro_batches
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                step.set(loss=total)                                       # memtop
            if mon.should_stop:                                            # memtop
                break
    print(f"grad_accum: {mon.step_count} optimizer steps of {args.micro_batches} micro-batches; "
          f"report: {mon.run_dir / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
