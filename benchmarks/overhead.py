"""Monitoring overhead: tokens/s of a plain AMP loop vs the same training under headless memtop.

Both sides run in this one process, on a background thread each time (as memtop's trainer does),
interleaved A B A B ... so drift on a noisy machine hits both alike. Reports medians and the ratio.

    python benchmarks/overhead.py [--repeats 5] [--steps 100] [--warm 10]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time

import torch
from common import append_results, in_thread, machine, median

from probes.ring import Ring
from probes.runfolder import create_run_dir
from trainer.config import TrainConfig
from trainer.data import BatchSampler, load_corpus
from trainer.instruments import build_hooks
from trainer.loop import AMP_DTYPES, Trainer, use_fused_adamw
from trainer.model import GPT


def plain_loop(cfg: TrainConfig, warm: int, steps: int) -> float:
    """The loop people write without a monitor: same model, data, AMP and loss.item() per step."""
    torch.manual_seed(cfg.seed)
    device = cfg.torch_device
    model = GPT(cfg.model_config()).to(device)
    # the same optimizer as memtop's trainer (fused on CUDA), so the pair compares monitoring only
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.1,
                                  fused=use_fused_adamw(device))
    batches = BatchSampler(load_corpus(), cfg.batch_size, cfg.seq_len, cfg.seed, device)
    dtype = AMP_DTYPES.get(cfg.amp_mode)
    scaler = torch.amp.GradScaler(device.type) if cfg.amp_mode == "fp16" else None
    t0 = 0.0
    for step in range(warm + steps):
        if step == warm:
            t0 = time.perf_counter()
        x, y = batches.next_batch()
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            _, loss = model(x, y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
        else:
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
    return steps * cfg.batch_size * cfg.seq_len / (time.perf_counter() - t0)


def memtop_headless(cfg: TrainConfig, warm: int, steps: int) -> float:
    """memtop's trainer with every instrument and metrics.jsonl, feeding a ring as the UI would."""
    ring: Ring = Ring()
    with tempfile.TemporaryDirectory() as tmp:
        run_cfg = dataclasses.replace(cfg, steps=warm + steps, run_dir=tmp)
        trainer = Trainer(run_cfg, create_run_dir(tmp), sinks=[ring.push],
                          hooks=build_hooks(run_cfg))
        times: dict[int, float] = {}
        trainer.sinks.append(lambda r: times.__setitem__(r.step, r.time_s)
                             if hasattr(r, "tokens_per_s") else None)
        trainer.run()
    return steps * cfg.batch_size * cfg.seq_len / (times[warm + steps] - times[warm])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warm", type=int, default=10)
    parser.add_argument("--no-append", action="store_true", help="print only")
    args = parser.parse_args()
    cfg = TrainConfig(device="cpu", run_dir=tempfile.gettempdir())
    plain: list[float] = []
    ours: list[float] = []
    for i in range(args.repeats):
        plain.append(in_thread(plain_loop, cfg, args.warm, args.steps))
        ours.append(in_thread(memtop_headless, cfg, args.warm, args.steps))
        print(f"repeat {i + 1}: plain {plain[-1]:,.0f} tok/s, memtop {ours[-1]:,.0f} tok/s")
    ratio = median(ours) / median(plain)
    pair = median([o / p for o, p in zip(ours, plain, strict=True)])
    table = (
        "| side | tokens/s (median of {n}) | all repeats |\n|---|---|---|\n"
        "| plain AMP loop (no probes) | {p:,.0f} | {pa} |\n"
        "| memtop --headless (all instruments, metrics.jsonl) | {o:,.0f} | {oa} |\n\n"
        "Ratio of medians: **{r:.3f}**; median of paired ratios: {pr:.3f} (target ≥ 0.99: {met})."
    ).format(n=args.repeats, p=median(plain), o=median(ours), r=ratio, pr=pair,
             pa=", ".join(f"{v:,.0f}" for v in plain), oa=", ".join(f"{v:,.0f}" for v in ours),
             met="met" if ratio >= 0.99 else "MISSED")
    body = (f"Config: default `memtop train` model (B={cfg.batch_size}, T={cfg.seq_len}, "
            f"{cfg.layers} layers, dim {cfg.dim}, {cfg.attention} attention, amp "
            f"{cfg.amp_mode}, device cpu); {args.warm} warm-up steps then {args.steps} timed "
            f"steps per repeat, interleaved, each on a background thread.\n"
            f"Command: `python benchmarks/overhead.py --repeats {args.repeats} --steps "
            f"{args.steps}`\n\n{table}")
    print(machine())
    print(table)
    if not args.no_append:
        append_results("Monitoring overhead: plain loop vs headless memtop", body)


if __name__ == "__main__":
    main()
