"""A PyTorch Lightning run watched by memtop: one line, ``callbacks=[MemtopCallback()]``.

    pip install -e '.[lightning]'
    python examples/lightning_fit.py --steps 60 --accumulate 2    # CPU, well under a minute
    memtop view out/lightning/memtop                              # in another terminal

A small next-token model (embedding, GRU, linear head) as a LightningModule learns a synthetic
token pattern with the real ``lightning.Trainer``: gradient accumulation, validation and
checkpoints on Lightning's schedule. memtop writes its run folder under
``default_root_dir/memtop/``; the tests (tests/integration/test_lightning_fit.py) and the
callback's cost benchmark (benchmarks/cases/frameworks/) use the same module and data.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

VOCAB, SEQ = 64, 32


def _lightning():
    import lightning.pytorch as pl

    return pl


def make_module(dim: int = 64, lr: float = 3e-3) -> nn.Module:
    """The LightningModule: it returns its logits with the loss (a callback may look at them)
    and records every micro-batch's loss, as Lightning computed it, in ``micro_losses``."""
    pl = _lightning()

    class TinyLM(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.save_hyperparameters({"dim": dim, "lr": lr})
            self.embed = nn.Embedding(VOCAB, dim)
            self.gru = nn.GRU(dim, dim, batch_first=True)
            self.head = nn.Linear(dim, VOCAB)
            self.micro_losses: list[float] = []

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            h, _ = self.gru(self.embed(idx))                  # (B, T, dim)
            return self.head(h)                               # (B, T, vocab)

        def _loss(self, batch: tuple[torch.Tensor, torch.Tensor]):
            x, y = batch
            logits = self(x)
            return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()), logits

        def training_step(self, batch, batch_idx):
            loss, logits = self._loss(batch)
            self.micro_losses.append(float(loss.detach()))  # CPU: no device to wait for
            return {"loss": loss, "logits": logits.detach()}

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self._loss(batch)[0])

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=lr)

    torch.manual_seed(0)
    return TinyLM()


def sequences(n: int, seed: int = 0) -> torch.utils.data.TensorDataset:
    """``n`` (input, target) pairs of ``SEQ`` tokens: an arithmetic progression mod the
    vocabulary from a random start."""
    gen = torch.Generator().manual_seed(seed)
    seq = (torch.randint(0, VOCAB, (n, 1), generator=gen) + 3 * torch.arange(SEQ + 1)) % VOCAB
    return torch.utils.data.TensorDataset(seq[:, :-1], seq[:, 1:])


def make_trainer(root: str | Path, *, steps: int, accumulate: int = 2, val_every: int | None = 10,
                 callbacks: list | None = None, checkpoints: bool = True,
                 precision: str = "32-true", accelerator: str = "cpu") -> object:
    """The real ``lightning.Trainer`` (on CPU unless told): ``val_every`` optimizer steps
    between validations (a checkpoint after each), quiet (no logger, no progress bar)."""
    pl = _lightning()
    return pl.Trainer(
        max_steps=steps, accumulate_grad_batches=accumulate, accelerator=accelerator, devices=1,
        precision=precision, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=checkpoints,
        val_check_interval=val_every * accumulate if val_every else None,
        limit_val_batches=4 if val_every else 0, check_val_every_n_epoch=None,
        num_sanity_val_steps=0, default_root_dir=str(root), callbacks=callbacks or [])


def loaders(steps: int, accumulate: int, batch_size: int = 4, workers: int = 0):
    """(train, validation) loaders: enough batches for ``steps`` optimizer steps per epoch;
    ``workers``: the training loader's DataLoader workers (memtop reads their memory too)."""
    train = sequences(batch_size * accumulate * min(steps, 50))
    return (torch.utils.data.DataLoader(train, batch_size=batch_size, num_workers=workers),
            torch.utils.data.DataLoader(sequences(4 * batch_size, seed=1), batch_size=batch_size))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="A Lightning run watched by memtop.")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps (default: 60)")
    p.add_argument("--accumulate", type=int, default=2,
                   help="accumulate_grad_batches (default: 2)")
    p.add_argument("--root-dir", default="out/lightning",
                   help="Lightning's default_root_dir (default: out/lightning)")
    args = p.parse_args(argv)
    if min(args.steps, args.accumulate) < 1:
        p.error("--steps and --accumulate must be at least 1")
    try:
        from probes.integrations.lightning import MemtopCallback  # memtop
    except ImportError as err:  # memtop's FrameworkMissing says which extra to install
        print(f"lightning_fit: {err}", file=sys.stderr)
        return 2
    memtop = MemtopCallback()                                       # memtop: the one line
    trainer = make_trainer(args.root_dir, steps=args.steps, accumulate=args.accumulate,
                           callbacks=[memtop])
    train, val = loaders(args.steps, args.accumulate)
    trainer.fit(make_module(), train, val)
    run = memtop.driver.last_run
    print(f"lightning_fit: {trainer.global_step} optimizer steps of {args.accumulate} "
          f"micro-batches; memtop run folder: {run}; report: {run / 'report.md' if run else 'n/a'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
