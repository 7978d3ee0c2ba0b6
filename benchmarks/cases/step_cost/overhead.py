"""Monitoring overhead: tokens/s of a plain AMP loop vs the same training under headless memtop.

Both sides run in this one process, on a background thread each time (as memtop's trainer does),
in interleaved rounds [plain, headless, plain'] (odd rounds reversed) so drift on a noisy machine
hits both alike, and plain'/plain gives the A/A noise of the same run
(benchmarks/harness/pairs.py). Reports the median headless/plain ratio with its spread beside
the A/A spread and the target.

    python -m benchmarks run overhead [--pairs 7] [--steps 150] [--warm 10]
    python -m benchmarks run overhead --side headless --runs 3   # one side only (py-spy)
"""

from __future__ import annotations

import dataclasses
import tempfile
import time

import torch

from benchmarks.harness import RATIO_HEADER, in_thread, median, publish, run_pairs
from probes.monitor import default_hooks
from probes.runfolder import create_run_dir
from probes.tools.ring import Ring
from trainer.config import TrainConfig
from trainer.data import BatchSampler, load_corpus
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
    # the usual loop's scaler: a no-op (step() is optimizer.step()) unless fp16
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.amp_mode == "fp16")
    t0 = 0.0
    for step in range(warm + steps):
        if step == warm:
            t0 = time.perf_counter()
        x, y = batches.next_batch()
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            _, loss = model(x, y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
    return steps * cfg.batch_size * cfg.seq_len / (time.perf_counter() - t0)


def memtop_headless(cfg: TrainConfig, warm: int, steps: int) -> float:
    """memtop's trainer with every instrument and metrics.jsonl, feeding a ring as the UI would."""
    ring: Ring = Ring()
    with tempfile.TemporaryDirectory() as tmp:
        run_cfg = dataclasses.replace(cfg, steps=warm + steps, run_dir=tmp)
        trainer = Trainer(run_cfg, create_run_dir(tmp), sinks=[ring.push],
                          hooks=default_hooks(**run_cfg.hook_options()))
        times: dict[int, float] = {}
        trainer.sinks.append(lambda r: times.__setitem__(r.step, r.time_s)
                             if hasattr(r, "tokens_per_s") else None)
        trainer.run()
    return steps * cfg.batch_size * cfg.seq_len / (times[warm + steps] - times[warm])


TARGET = 0.99


def options(ap) -> None:
    ap.pairs(7, "plain, headless, plain'")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--warm", type=int, default=10)
    ap.quiet(max_wait=900)
    ap.add_argument("--side", choices=("plain", "headless"),
                    help="run only this side --runs times (for a profiler), no ratio")
    ap.add_argument("--runs", type=int, default=3)
    ap.amp()


def main(args) -> None:
    cfg = TrainConfig(device="cpu", run_dir=tempfile.gettempdir(), amp=args.amp)
    fns = {"plain": lambda: in_thread(plain_loop, cfg, args.warm, args.steps),
           "headless": lambda: in_thread(memtop_headless, cfg, args.warm, args.steps)}
    if args.side:
        for i in range(args.runs):
            print(f"{args.side} run {i + 1}: {fns[args.side]():,.0f} tok/s", flush=True)
        return
    pairs = run_pairs(args, "plain", fns, unit="tok/s", fmt="9,.0f")
    what = "headless memtop / plain loop, tokens/s"
    row, v = pairs.row("headless", what, TARGET)
    vals = pairs.values
    table = (f"{RATIO_HEADER}\n{row}\n\n"
             f"| side | tokens/s median | all rounds |\n|---|---|---|\n"
             f"| plain AMP loop (no probes) | {median(vals['plain']):,.0f} | "
             f"{', '.join(f'{x:,.0f}' for x in vals['plain'])} |\n"
             f"| memtop --headless (all instruments, metrics.jsonl) | "
             f"{median(vals['headless']):,.0f} | "
             f"{', '.join(f'{x:,.0f}' for x in vals['headless'])} |")
    body = (f"Config: default `memtop train` model (B={cfg.batch_size}, T={cfg.seq_len}, "
            f"{cfg.layers} layers, dim {cfg.dim}, {cfg.attention} attention, amp "
            f"{cfg.amp_mode}, device cpu); {args.warm} warm-up steps then {args.steps} timed "
            f"steps per run, each on a background thread; {args.pairs} rounds of [plain, "
            f"headless, plain'] (odd rounds reversed), A/A = plain'/plain of the same round. "
            f"{pairs.note()} Wall time {pairs.minutes:.1f} min.\n\n{table}\n\n"
            f"Result: headless/plain {v}.")
    publish(args, "Monitoring overhead: plain loop vs headless memtop", body,
            [pairs.figure("overhead/headless", what + " (separate runs, one process)",
                          "headless", TARGET)])
