"""The public Monitor's cost on a loop of your own: examples/own_loop.py's CNN with and without it.

Both sides run the same SmallCNN on the same synthetic batches, in this process, each run on a
background thread, in interleaved rounds [plain, monitored, plain'] (odd rounds reversed,
benchmarks/common.py); plain'/plain is the A/A noise of the same run. The monitored side has every
instrument on (profiler window ready, leak watch, ledger, request socket, metrics.jsonl). fp32 by
default: the faster the step, the larger memtop's share of it, so this is the conservative case.

    python benchmarks/monitor_overhead.py [--pairs 7] [--steps 200] [--amp off]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch
from common import (
    RATIO_HEADER,
    ROOT,
    append_results,
    in_thread,
    interleaved_pairs,
    load_note,
    median,
    ratio_row,
)
from torch import nn

sys.path.insert(0, str(ROOT / "examples"))
from own_loop import SmallCNN, synthetic_batches  # noqa: E402

from probes import Monitor  # noqa: E402

TARGET = 0.99


def run(monitored: bool, steps: int, warm: int, batch: int, amp: str) -> float:
    """Samples/s over ``steps`` steps after ``warm`` warm-up steps."""
    torch.manual_seed(0)
    model = SmallCNN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    data = synthetic_batches(batch, torch.device("cpu"))
    dtype = {"bf16": torch.bfloat16}.get(amp)
    with tempfile.TemporaryDirectory() as tmp:
        mon = Monitor(model, optimizer, samples_per_step=batch, run_dir=tmp,
                      warmup_steps=warm) if monitored else None
        t0 = 0.0
        for i in range(warm + steps):
            if i == warm:
                t0 = time.perf_counter()
            x, y = next(data)
            with mon.step() if mon else _nothing() as step:
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


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warm", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--amp", choices=("off", "bf16"), default="off")
    ap.add_argument("--max-busy", type=float, default=0.3)
    ap.add_argument("--max-wait", type=float, default=600)
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args()
    from common import wait_quiet

    wait_quiet(args.max_busy, args.max_wait, "before the first round")
    fns = {side: (lambda m=m: in_thread(run, m, args.steps, args.warm, args.batch_size, args.amp))
           for side, m in (("plain", False), ("monitored", True))}

    def show(rnd: int, label: str, value: float, others: float) -> None:
        print(f"round {rnd + 1} {label:>16}: {value:8,.1f} samples/s (others {others:.2f})",
              flush=True)

    res = interleaved_pairs("plain", fns, args.pairs, on_result=show)
    others = res["others_cores"]
    row, _ = ratio_row("Monitor / plain loop (own_loop CNN), samples/s",
                       res["ratios"]["monitored"], res["aa"], TARGET,
                       sum(others) / len(others), args.max_busy)
    vals = res["values"]
    table = (f"{RATIO_HEADER}\n{row}\n\n| side | samples/s median | all rounds |\n|---|---|---|\n"
             + "".join(f"| {k} | {median(v):,.1f} | {', '.join(f'{x:,.1f}' for x in v)} |\n"
                       for k, v in vals.items()))
    print(table)
    if not args.no_append:
        append_results(
            "Monitor on your own loop: examples/own_loop.py's CNN, plain vs monitored",
            f"Config: SmallCNN, B={args.batch_size}, amp {args.amp}, CPU; {args.warm} warm-up "
            f"then {args.steps} timed steps per run, each on a background thread; "
            f"{args.pairs} rounds of [plain, monitored, plain'] (odd rounds reversed). "
            f"{load_note(others, args.max_busy)} Wall time {res['seconds'] / 60:.1f} min.\n"
            f"Command: `python benchmarks/monitor_overhead.py --pairs {args.pairs} --steps "
            f"{args.steps} --amp {args.amp}`\n\n{table}")


if __name__ == "__main__":
    main()
