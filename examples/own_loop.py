"""Your own training loop, watched by memtop: a small CNN on synthetic images.

    python examples/own_loop.py --steps 60 --run-dir runs      # then, in another terminal:
    memtop view runs                                            # follow it live, press p

Everything memtop-specific is marked `# memtop`: create a Monitor with the model, the optimizer,
the GradScaler and how many samples a step sees; wrap each optimizer step in `mon.step()`; hand
the loss over; honour `mon.should_stop`. The run folder it writes is the one `memtop train`
writes (config.json, metrics.jsonl, report.md), so `memtop view`, `memtop runs` and the report
work on it unchanged. On CUDA the loop uses fp16 autocast with a GradScaler; on CPU it uses bf16
autocast, which needs no scaler (bf16 has fp32's exponent range).
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

from probes import Monitor  # memtop
from probes.records.errors import MemtopError  # memtop


class SmallCNN(nn.Module):
    """A classifier for 3×32×32 images: two conv blocks and a linear head."""

    def __init__(self, width: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.MaxPool2d(2),                                   # (B, w, 16, 16)
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.MaxPool2d(2),                                   # (B, 2w, 8, 8)
        )
        self.head = nn.Linear(2 * width * 8 * 8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))          # (B, classes)


def synthetic_batches(batch_size: int, device: torch.device, seed: int = 0):
    """Endless (images, labels) whose label is readable from the image, so the loss falls."""
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(10, 3, 32, 32, generator=gen)
    while True:
        y = torch.randint(0, 10, (batch_size,), generator=gen)
        x = centers[y] + 3.0 * torch.randn(batch_size, 3, 32, 32, generator=gen)
        yield x.to(device), y.to(device)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="A CNN training loop instrumented with memtop.")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps (default: 60)")
    p.add_argument("--run-dir", default="runs", help="folder for run folders (default: runs)")
    p.add_argument("--batch-size", type=int, default=32, help="images per step (default: 32)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="{auto,cpu,cuda} (default: auto)")
    p.add_argument("--amp", default="auto", choices=["auto", "off", "bf16", "fp16"],
                   help="{auto,off,bf16,fp16}: auto is fp16+GradScaler on CUDA, bf16 on CPU")
    args = p.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1:
        p.error("--steps and --batch-size must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is visible to torch")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else ("cpu" if args.device == "auto" else args.device))
    amp = args.amp if args.amp != "auto" else ("fp16" if device.type == "cuda" else "bf16")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
    torch.manual_seed(0)
    model = SmallCNN().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # fp16 needs loss scaling; with bf16 or fp32 the scaler is simply off.
    scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")
    loss_fn = nn.CrossEntropyLoss()
    batches = synthetic_batches(args.batch_size, device)

    try:
        mon = Monitor(model, optimizer, scaler=scaler,                     # memtop
                      samples_per_step=args.batch_size, run_dir=args.run_dir,
                      max_steps=args.steps, config=vars(args))
    except MemtopError as err:  # e.g. a run folder that cannot be written
        print(f"own_loop: {err}", file=sys.stderr)
        return 2
    print(f"own_loop: writing {mon.run_dir}; follow it with: memtop view {mon.run_dir}")
    with mon:                                                              # memtop
        for _ in range(args.steps):
            x, y = next(batches)
            with mon.step() as step:                                       # memtop
                with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                    loss = loss_fn(model(x), y)
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                grad_norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                step.set(loss=loss, grad_norm=grad_norm)                   # memtop
            if mon.should_stop:  # a viewer pressed x, or --max-memory   # memtop
                break
    last = mon.state.last_sample
    print(f"own_loop: {mon.step_count} steps, loss {last.loss:.3f}; report: "
          f"{mon.run_dir / 'report.md'}" if last else "own_loop: no step ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
