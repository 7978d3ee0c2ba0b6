"""The DataLoader workers' sampler (probes/counters/workers.py): its CPU with 0, 2 and 8 workers,
and the step ratio of a monitored loop with and without it.

    python benchmarks/workers_sampler.py [--seconds 10] [--rounds 3] [--pairs 7] [--steps 60]

Part 1: N real DataLoader workers (fork, persistent) are started and kept alive; the sampler
thread reads them every second for ``--seconds``; its CPU is the thread's own utime + stime from
/proc/self/task/TID/stat over the wall time (median of ``--rounds``), with the milliseconds one
reading took. Where the kernel keeps no child lists (CONFIG_PROC_CHILDREN off) a reading walks
every process's /proc/PID/stat: the box's process count is printed beside the figure.

Part 2: memtop's default GPT (B=16, T=128, 4 layers, width 128) fed by a DataLoader with 2
workers, under probes.Monitor, the sampler off (``workers_sample_s=None``) against on (1 s),
in interleaved rounds [off, on, off'] (benchmarks/common.py: the A/A ratio off'/off is the
noise band); tokens/s over ``--steps`` steps after ``--warm``. Target: the ratio inside the
noise band (the sampler never touches the step path).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
from common import (
    RATIO_HEADER,
    in_thread,
    interleaved_pairs,
    load_note,
    median,
    proc_cpu_s,
    publish,
    ratio_row,
    wait_quiet,
)
from torch.utils.data import DataLoader, Dataset

from probes import Monitor
from probes.counters.workers import ProcessTreeSampler
from trainer.config import TrainConfig
from trainer.data import load_corpus
from trainer.model import GPT

TARGET = 0.99


class Windows(Dataset):
    """(x, y) windows of the shipped text, item ``i`` always the same window."""

    def __init__(self, seq_len: int, n: int = 1_000_000) -> None:
        self.data, self.seq_len, self.n = load_corpus().long(), seq_len, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = (i * 7919) % (self.data.numel() - self.seq_len - 1)
        window = self.data[start:start + self.seq_len + 1]
        return window[:-1], window[1:]


def sampler_cpu(workers: int, seconds: float) -> tuple[float, float, int]:
    """(CPU seconds per second of the sampler's thread, ms per reading, readings) with
    ``workers`` live DataLoader workers."""
    loader = DataLoader(Windows(128), batch_size=16, num_workers=workers,
                        persistent_workers=workers > 0)
    batches = iter(loader)
    next(batches)  # the workers run from here
    sampler = ProcessTreeSampler(interval_s=1.0)
    sampler.start()
    assert sampler._thread is not None
    tid = sampler._thread.native_id
    cpu0, t0 = proc_cpu_s(os.getpid(), tid) or 0.0, time.perf_counter()
    end = t0 + seconds
    seq = sampler.latest.seq if sampler.latest else 0
    while time.perf_counter() < end:  # wait on its readings, never on a guess of its pace
        reading = sampler.wait_for_reading(seq, 5.0)
        seq = reading.seq if reading else seq
    cpu1, t1 = proc_cpu_s(os.getpid(), tid) or 0.0, time.perf_counter()
    readings = sampler.latest.seq if sampler.latest else 0
    assert sampler.latest is not None and sampler.latest.workers == workers, "workers not seen"
    sampler.stop()
    ms = sampler.read_s / max(1, readings) * 1000
    del batches
    return (cpu1 - cpu0) / (t1 - t0), ms, readings


def gpt_run(sampled: bool, steps: int, warm: int) -> float:
    """tokens/s of the default GPT fed by 2 workers, the workers' sampler on or off."""
    torch.manual_seed(0)
    cfg = TrainConfig(device="cpu")
    model = GPT(cfg.model_config())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    loader = DataLoader(Windows(cfg.seq_len), batch_size=cfg.batch_size, num_workers=2,
                        persistent_workers=True)
    tokens = cfg.batch_size * cfg.seq_len
    with tempfile.TemporaryDirectory() as tmp:
        mon = Monitor(model, opt, tokens_per_step=tokens, run_dir=tmp, warmup_steps=warm,
                      workers_sample_s=1.0 if sampled else None, write_report=False)
        batches = iter(loader)
        t0 = 0.0
        for i in range(warm + steps):
            if i == warm:
                t0 = time.perf_counter()
            x, y = next(batches)
            with mon.step() as step:
                _, loss = model(x, y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                step.set(loss=loss)
        elapsed = time.perf_counter() - t0
        mon.close()
        del batches
    return steps * tokens / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--max-busy", type=float, default=0.3)
    ap.add_argument("--max-wait", type=float, default=600)
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args()
    wait_quiet(args.max_busy, args.max_wait, "before the first round")
    procs = sum(1 for name in os.listdir("/proc") if name.isdigit())
    lines = ["| workers | sampler CPU (cores) median | min–max | ms per reading median | "
             "readings |", "|---|---|---|---|---|"]
    for n in (0, 2, 8):
        got = [sampler_cpu(n, args.seconds) for _ in range(args.rounds)]
        cpu = [g[0] for g in got]
        lines.append(f"| {n} | {median(cpu):.5f} | {min(cpu):.5f}–{max(cpu):.5f} | "
                     f"{median([g[1] for g in got]):.2f} | {sum(g[2] for g in got)} |")
        print(lines[-1], flush=True)
    how = ProcessTreeSampler().lister.how

    def show(rnd: int, label: str, value: float, others: float) -> None:
        print(f"round {rnd + 1} {label:>14}: {value:8,.0f} tokens/s (others {others:.2f})",
              flush=True)

    fns = {side: (lambda s=s: in_thread(gpt_run, s, args.steps, args.warm))
           for side, s in (("sampler off", False), ("sampler on", True))}
    res = interleaved_pairs("sampler off", fns, args.pairs, on_result=show)
    others = res["others_cores"]
    row, _ = ratio_row("default GPT + 2 workers, sampler on / off, tokens/s",
                       res["ratios"]["sampler on"], res["aa"], TARGET,
                       sum(others) / len(others), args.max_busy)
    body = (f"Part 1: the sampler thread's CPU at 1 Hz over {args.seconds:g} s, {args.rounds} "
            f"rounds per row; children found by {how}; {procs} processes on the box.\n\n"
            + "\n".join(lines) +
            f"\n\nPart 2: memtop's default GPT (CPU, fp32) fed by DataLoader(num_workers=2), "
            f"{args.warm} warm-up then {args.steps} timed steps per run, {args.pairs} rounds of "
            f"[off, on, off'] (odd rounds reversed). {load_note(others, args.max_busy)} Wall "
            f"time {res['seconds'] / 60:.1f} min.\n"
            f"Command: `python benchmarks/workers_sampler.py --seconds {args.seconds:g} "
            f"--rounds {args.rounds} --pairs {args.pairs} --steps {args.steps}`\n\n"
            f"{RATIO_HEADER}\n{row}\n")
    publish("DataLoader workers' sampler: CPU with 0/2/8 workers, step ratio on/off", body,
            not args.no_append)


if __name__ == "__main__":
    main()
