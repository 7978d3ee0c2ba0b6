"""The DataLoader workers' sampler (probes/counters/workers.py): its CPU with 0, 2 and 8 workers,
and the step ratio of a monitored loop with and without it.

    python -m benchmarks run workers_sampler [--seconds 10] [--rounds 3] [--pairs 7] [--steps 60]
        [--max-busy 0.3] [--no-append]

Part 1: N real DataLoader workers (fork, persistent) are started and kept alive; the sampler
thread reads them every second for ``--seconds``; its CPU is the thread's own utime + stime from
/proc/self/task/TID/stat over the wall time (median of ``--rounds``), with the milliseconds one
reading took. Where the kernel keeps no child lists (CONFIG_PROC_CHILDREN off) a reading walks
every process's /proc/PID/stat: the box's process count is printed beside the figure. Target: a
few % of a core (judged at ≤ 5% with 8 workers, from 3 rounds on a quiet machine).

Part 2: memtop's default GPT (B=16, T=128, 4 layers, width 128, fp32) fed by a DataLoader with 2
workers, under probes.Monitor, the sampler off (``workers_sample_s=None``) against on (1 s),
in interleaved rounds [off, on, off'] (benchmarks/harness/pairs.py: the A/A ratio off'/off is
the noise band); tokens/s over ``--steps`` steps after ``--warm``. Target: the ratio inside the
noise band, ≥ 0.99 (the sampler never touches the step path).
"""

from __future__ import annotations

import os
import tempfile
import time

import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.harness import (
    MIN_PAIRS,
    RATIO_HEADER,
    BadInput,
    Figure,
    LoadMeter,
    in_thread,
    md_table,
    median,
    met,
    proc_cpu_s,
    publish,
    run_pairs,
    wait_quiet,
)
from probes import Monitor
from probes.counters.workers import ProcessTreeSampler
from trainer.config import TrainConfig
from trainer.data import load_corpus
from trainer.model import GPT

TARGET = 0.99  # sampler on / off: inside the A/A noise
CPU_TARGET = 0.05  # "a few % of a core", the sampler's thread with 8 workers
WORKERS = (0, 2, 8)
MIN_ROUNDS = 3  # fewer part-1 rounds: printed, not judged


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


def gpt_run(sampled: bool, steps: int, warm: int, device: torch.device | str = "cpu") -> float:
    """tokens/s of the default GPT fed by 2 workers, the workers' sampler on or off. On CUDA (the
    GPU claim, benchmarks/gpu/claims/workers.py): pinned batches, bf16 autocast, timed between
    syncs."""
    torch.manual_seed(0)
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    cfg = TrainConfig(device=dev.type)
    model = GPT(cfg.model_config()).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    loader = DataLoader(Windows(cfg.seq_len), batch_size=cfg.batch_size, num_workers=2,
                        persistent_workers=True, pin_memory=cuda)
    tokens = cfg.batch_size * cfg.seq_len

    def now() -> float:
        if cuda:
            torch.cuda.synchronize(dev)
        return time.perf_counter()

    with tempfile.TemporaryDirectory() as tmp:
        mon = Monitor(model, opt, tokens_per_step=tokens, run_dir=tmp, warmup_steps=warm,
                      workers_sample_s=1.0 if sampled else None, write_report=False)
        batches = iter(loader)
        t0 = 0.0
        for i in range(warm + steps):
            if i == warm:
                t0 = now()
            x, y = (t.to(dev, non_blocking=True) for t in next(batches))
            with mon.step() as step:
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
                    _, loss = model(x, y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                step.set(loss=loss)
        elapsed = now() - t0
        mon.close()
        del batches
    return steps * tokens / elapsed


def options(ap) -> None:
    ap.add_argument("--seconds", type=float, default=10.0,
                    help="part 1: how long the sampler reads each set of workers, per round")
    ap.add_argument("--rounds", type=int, default=3, help="part 1: rounds per worker count")
    ap.pairs(7, "sampler off, sampler on, sampler off'")
    ap.add_argument("--steps", type=int, default=60, help="part 2: timed steps per run")
    ap.add_argument("--warm", type=int, default=5, help="part 2: steps before the timed ones")
    ap.quiet()


def judged(verdict: str, rounds: int, others: float, max_busy: float) -> str:
    """Part 1's verdict, unless too few rounds or other processes' load leave it not judged."""
    if rounds < MIN_ROUNDS:
        return f"not judged ({rounds} rounds < {MIN_ROUNDS})"
    if others > max_busy:
        return f"not judged (under load: others used {others:.2f} cores)"
    return verdict


def main(args) -> None:
    if args.seconds <= 0 or args.rounds < 1 or args.pairs < 1 or args.steps < 1 or args.warm < 0:
        raise BadInput("--seconds, --rounds, --pairs and --steps must be positive, --warm not "
                       "negative")
    wait_quiet(args.max_busy, args.max_wait, "before the first round")
    procs = sum(1 for name in os.listdir("/proc") if name.isdigit())
    meter, got = LoadMeter(), {}
    for n in WORKERS:
        got[n] = [sampler_cpu(n, args.seconds) for _ in range(args.rounds)]
        print(f"{n} workers: the sampler's thread {median([g[0] for g in got[n]]):.2%} of a core, "
              f"{median([g[1] for g in got[n]]):.2f} ms a reading", flush=True)
    others = meter.others_cores()
    cpu = {n: [g[0] for g in got[n]] for n in WORKERS}
    ms = {n: median([g[1] for g in got[n]]) for n in WORKERS}
    table = md_table(["workers", "sampler CPU (cores) median", "min–max",
                      "ms per reading median", "readings"],
                     [[n, f"{median(cpu[n]):.5f}", f"{min(cpu[n]):.5f}–{max(cpu[n]):.5f}",
                       f"{ms[n]:.2f}", sum(g[2] for g in got[n])] for n in WORKERS])
    how = ProcessTreeSampler().lister.how

    sides = {side: (lambda s=s: in_thread(gpt_run, s, args.steps, args.warm))
             for side, s in (("sampler off", False), ("sampler on", True))}
    pairs = run_pairs(args, "sampler off", sides, unit="tok/s", fmt=",.0f", wait=False)
    what = "default GPT + 2 workers, sampler on / off, tokens/s"
    row, _ = pairs.row("sampler on", what, TARGET)
    body = (f"Part 1: the sampler thread's CPU at 1 Hz over {args.seconds:g} s, {args.rounds} "
            f"rounds per row; children found by {how}; {procs} processes on the box; other "
            f"processes used {others:.2f} cores meanwhile.\n\n{table}\n\n"
            f"Part 2: memtop's default GPT (CPU, fp32) fed by DataLoader(num_workers=2), "
            f"{args.warm} warm-up then {args.steps} timed steps per run, {args.pairs} rounds of "
            f"[off, on, off'] (odd rounds reversed; fewer than {MIN_PAIRS}: not judged). "
            f"{pairs.note()} Wall time {pairs.minutes:.1f} min.\n\n{RATIO_HEADER}\n{row}\n")
    most = max(WORKERS)
    slash = " / ".join
    value = (f"{median(cpu[most]):.1%} of a core at {most} workers (min–max "
             f"{min(cpu[most]):.1%}–{max(cpu[most]):.1%}); {slash(map(str, WORKERS))} workers: "
             f"{slash(f'{median(cpu[n]):.1%}' for n in WORKERS)}, "
             f"{slash(f'{ms[n]:.1f}' for n in WORKERS)} ms a reading; {args.rounds} rounds of "
             f"{args.seconds:g} s")
    verdict = judged(met(median(cpu[most]), CPU_TARGET), args.rounds, others, args.max_busy)
    publish(args, "DataLoader workers' sampler: CPU with 0/2/8 workers, step ratio on/off", body,
            [Figure("workers_sampler/sampler_cpu", "the DataLoader workers' sampler thread at "
                    "1 Hz: its CPU with 0 / 2 / 8 live workers, and ms a reading",
                    f"≤ {CPU_TARGET:.0%} of a core at {most} workers (a few %)", value, verdict),
             pairs.figure("workers_sampler/step_ratio", "the default GPT fed by 2 workers, "
                          "the workers' sampler on / off, tokens/s (interleaved, A/A)",
                          "sampler on", TARGET)])
