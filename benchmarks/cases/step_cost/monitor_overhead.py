"""The public Monitor's cost on a loop of your own: examples/own_loop.py's CNN with and without it.

Both sides run the same SmallCNN on the same synthetic batches, in this process, each run on a
background thread, in interleaved rounds [plain, monitored, plain'] (odd rounds reversed,
benchmarks/harness/pairs.py); plain'/plain is the A/A noise of the same run. The monitored side
has every instrument on (profiler window ready, leak watch, ledger, request socket,
metrics.jsonl). fp32 by default: the faster the step, the larger memtop's share of it, so this
is the conservative case.

    python -m benchmarks run monitor_overhead [--pairs 7] [--steps 200] [--amp off]
"""

from __future__ import annotations

import contextlib
import tempfile
import time

import torch
from torch import nn

from benchmarks.harness import RATIO_HEADER, in_thread, median, publish, run_pairs
from benchmarks.harness.examples import example
from probes import Monitor

TARGET = 0.99


def run(monitored: bool, steps: int, warm: int, batch: int, amp: str) -> float:
    """Samples/s over ``steps`` steps after ``warm`` warm-up steps."""
    torch.manual_seed(0)
    own_loop = example("own_loop")
    model = own_loop.SmallCNN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    data = own_loop.synthetic_batches(batch, torch.device("cpu"))
    dtype = {"bf16": torch.bfloat16}.get(amp)
    with tempfile.TemporaryDirectory() as tmp:
        mon = Monitor(model, optimizer, samples_per_step=batch, run_dir=tmp,
                      warmup_steps=warm) if monitored else None
        t0 = 0.0
        for i in range(warm + steps):
            if i == warm:
                t0 = time.perf_counter()
            x, y = next(data)
            with mon.step() if mon else contextlib.nullcontext() as step:
                with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
                    loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if step is not None:
                    step.set(loss=loss)
                else:
                    loss.item()  # the plain loop reads its loss too: one sync each side
        elapsed = time.perf_counter() - t0
        if mon is not None:
            mon.close()
    return steps * batch / elapsed


def options(ap) -> None:
    ap.pairs(7, "plain, monitored, plain'")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warm", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.amp(("off", "bf16"), "off")
    ap.quiet()


def main(args) -> None:
    fns = {side: (lambda m=m: in_thread(run, m, args.steps, args.warm, args.batch_size, args.amp))
           for side, m in (("plain", False), ("monitored", True))}
    pairs = run_pairs(args, "plain", fns, unit="samples/s", fmt="8,.1f")
    what = "Monitor / plain loop (own_loop CNN), samples/s"
    row, _ = pairs.row("monitored", what, TARGET)
    table = (f"{RATIO_HEADER}\n{row}\n\n| side | samples/s median | all rounds |\n|---|---|---|\n"
             + "".join(f"| {k} | {median(v):,.1f} | {', '.join(f'{x:,.1f}' for x in v)} |\n"
                       for k, v in pairs.values.items()))
    body = (f"Config: SmallCNN, B={args.batch_size}, amp {args.amp}, CPU; {args.warm} warm-up "
            f"then {args.steps} timed steps per run, each on a background thread; "
            f"{args.pairs} rounds of [plain, monitored, plain'] (odd rounds reversed). "
            f"{pairs.note()} Wall time {pairs.minutes:.1f} min.\n\n{table}")
    publish(args, "Monitor on your own loop: examples/own_loop.py's CNN, plain vs monitored",
            body, [pairs.figure("monitor_overhead/cnn", "the public Monitor on your own loop "
                                "(examples/own_loop.py's CNN), separate runs", "monitored",
                                TARGET)], shown=table)
