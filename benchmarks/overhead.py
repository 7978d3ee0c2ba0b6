"""Monitoring overhead: tokens/s of a plain AMP loop vs the same training under headless memtop.

Both sides run in this one process, on a background thread each time (as memtop's trainer does),
in interleaved rounds [plain, headless, plain'] (odd rounds reversed) so drift on a noisy machine
hits both alike, and plain'/plain gives the A/A noise of the same run (benchmarks/common.py).
Reports the median headless/plain ratio with its spread beside the A/A spread and the target.

    python benchmarks/overhead.py [--pairs 7] [--steps 150] [--warm 10]
    python benchmarks/overhead.py --side headless --runs 3   # one side only (under py-spy)
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time

import torch
from common import (
    RATIO_HEADER,
    append_results,
    in_thread,
    interleaved_pairs,
    load_note,
    machine,
    median,
    ratio_row,
)

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
                          hooks=default_hooks(**run_cfg.hook_options()))
        times: dict[int, float] = {}
        trainer.sinks.append(lambda r: times.__setitem__(r.step, r.time_s)
                             if hasattr(r, "tokens_per_s") else None)
        trainer.run()
    return steps * cfg.batch_size * cfg.seq_len / (times[warm + steps] - times[warm])


TARGET = 0.99


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=7, help="rounds (each: plain, headless, "
                        "plain again for the A/A noise); fewer than 7 are not judged")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warm", type=int, default=10)
    parser.add_argument("--max-busy", type=float, default=0.3,
                        help="wait until fewer cores than this are busy; runs where other "
                             "processes used more are marked as measured under load")
    parser.add_argument("--max-wait", type=float, default=900,
                        help="seconds to wait for idle cores before measuring anyway")
    parser.add_argument("--side", choices=("plain", "headless"),
                        help="run only this side --runs times (for a profiler), no ratio")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--amp", choices=("auto", "off", "bf16"), default="auto",
                        help="off on a CPU without native bf16, where bf16 is ~16× slower")
    parser.add_argument("--no-append", action="store_true", help="print only")
    args = parser.parse_args()
    cfg = TrainConfig(device="cpu", run_dir=tempfile.gettempdir(), amp=args.amp)
    fns = {"plain": lambda: in_thread(plain_loop, cfg, args.warm, args.steps),
           "headless": lambda: in_thread(memtop_headless, cfg, args.warm, args.steps)}
    if args.side:
        for i in range(args.runs):
            print(f"{args.side} run {i + 1}: {fns[args.side]():,.0f} tok/s", flush=True)
        return
    from common import wait_quiet

    wait_quiet(args.max_busy, args.max_wait, "before the first round")

    def show(rnd: int, label: str, value: float, others: float) -> None:
        print(f"round {rnd + 1} {label:>14}: {value:9,.0f} tok/s (others {others:.2f} cores)",
              flush=True)

    res = interleaved_pairs("plain", fns, args.pairs, on_result=show)
    others = res["others_cores"]
    row, v = ratio_row("headless memtop / plain loop, tokens/s", res["ratios"]["headless"],
                       res["aa"], TARGET, sum(others) / len(others), args.max_busy)
    vals = res["values"]
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
            f"{load_note(others, args.max_busy)} Wall time {res['seconds'] / 60:.1f} min.\n"
            f"Command: `python benchmarks/overhead.py --amp {args.amp} --pairs {args.pairs} "
            f"--steps {args.steps}`\n\n{table}\n\nResult: headless/plain {v}.")
    print(machine())
    print(body)
    if not args.no_append:
        append_results("Monitoring overhead: plain loop vs headless memtop", body)


if __name__ == "__main__":
    main()
