"""Batches of the shipped text (trainer/corpus.py) as tensors on the training device."""

from __future__ import annotations

import torch

from trainer.corpus import corpus_raw


def load_corpus() -> torch.Tensor:
    """The shipped text as a 1-D uint8 tensor of byte values; nothing is downloaded."""
    return torch.frombuffer(bytearray(corpus_raw()), dtype=torch.uint8)


class BatchSampler:
    """Random (B, T) windows of the corpus from its own generator, so runs are reproducible."""

    def __init__(self, corpus: torch.Tensor, batch_size: int, seq_len: int, seed: int,
                 device: torch.device) -> None:
        if corpus.numel() <= seq_len + 1:
            raise ValueError(f"seq-len {seq_len} is longer than the shipped text allows")
        self.data = corpus.long()
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.device = device
        self.gen = torch.Generator().manual_seed(seed)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, self.data.numel() - self.seq_len - 1, (self.batch_size,),
                               generator=self.gen)
        offsets = torch.arange(self.seq_len)
        idx = starts[:, None] + offsets[None, :]  # (B, T)
        x, y = self.data[idx], self.data[idx + 1]
        if self.device.type == "cuda":
            return (x.pin_memory().to(self.device, non_blocking=True),
                    y.pin_memory().to(self.device, non_blocking=True))
        return x, y
