"""GPU claims about memtop's per-step cost on CUDA: blocks of plain steps and blocks of monitored
steps interleaved on one model in one process (the step_overhead case's method, on the GPU), at
two step sizes, judged against the same run's A/A noise (benchmarks/harness/stats.py)."""

from __future__ import annotations

import contextlib
import tempfile
import time
from typing import Any

import torch
from torch.profiler import record_function

from benchmarks.gpu.device import free_device
from benchmarks.gpu.registry import Ctx, Outcome, claim
from benchmarks.harness import interleaved_pairs, noise_band, quartiles, verdict

TARGETS = {"default": 0.99, "large": 0.995}  # monitored / plain tokens per second (issue 45)
SIZES = {  # name -> (TrainConfig fields, steps per block, pairs)
    "default": ({}, 20, 15),  # memtop train's default GPT: a few ms per step on a big GPU
    "large": ({"batch_size": 32, "seq_len": 512, "block_size": 512, "layers": 8, "dim": 512,
               "heads": 8, "attention": "sdpa"}, 8, 9),
}


class GpuWorkload:
    """memtop's GPT, its fused AdamW, fp16 + GradScaler and its data on the GPU, stepped plain
    (loss.item() per step: one sync) or inside Monitor.step() (every instrument, the socket,
    metrics.jsonl; its one read of loss, grad norm and scale)."""

    def __init__(self, cfg: Any, run_dir: str) -> None:
        from probes import Monitor
        from trainer.data import BatchSampler, load_corpus
        from trainer.loop import use_fused_adamw
        from trainer.model import GPT

        device = cfg.torch_device
        torch.manual_seed(cfg.seed)
        self.model = GPT(cfg.model_config()).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=0.1,
                                     fused=use_fused_adamw(device))
        self.scaler = torch.amp.GradScaler("cuda")
        self.batches = BatchSampler(load_corpus(), cfg.batch_size, cfg.seq_len, cfg.seed,
                                    device)
        self.tokens = cfg.batch_size * cfg.seq_len
        self.clip = cfg.grad_clip
        self.monitor = Monitor(self.model, self.opt, scaler=self.scaler,
                               tokens_per_step=self.tokens, run_dir=run_dir, amp="fp16",
                               write_report=False)

    def _step(self, ranges: bool) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.batches.next_batch()
        label = record_function if ranges else (lambda _name: contextlib.nullcontext())
        with label("forward"), torch.autocast("cuda", dtype=torch.float16):
            _, loss = self.model(x, y)
        with label("backward"):
            self.scaler.scale(loss).backward()
        with label("optimizer"):
            self.scaler.unscale_(self.opt)
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
            self.scaler.step(self.opt)
            self.scaler.update()
            self.opt.zero_grad(set_to_none=True)
        return loss, norm

    def plain_step(self) -> None:
        loss, _ = self._step(ranges=False)
        loss.item()

    def monitored_step(self) -> None:
        with self.monitor.step() as s:
            loss, norm = self._step(ranges=True)  # memtop's trainer labels its phases
            s.set(loss=loss, grad_norm=norm)

    def block(self, monitored: bool, steps: int) -> float:
        step = self.monitored_step if monitored else self.plain_step
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        return steps * self.tokens / (time.perf_counter() - t0)


def measure(ctx: Ctx, size: str) -> dict[str, Any]:
    fields, block, pairs = SIZES[size]
    cfg = ctx.config(amp="fp16", **fields)
    with tempfile.TemporaryDirectory() as tmp:
        w = GpuWorkload(cfg, tmp)
        for i in range(6):  # both paths warm: kernels chosen, allocator grown, ledger sampled
            w.block(i % 2 == 1, 2)
        res = interleaved_pairs("plain", {"plain": lambda: w.block(False, block),
                                          "monitored": lambda: w.block(True, block)}, pairs)
        step_ms = 1000 * w.tokens / max(res["values"]["plain"])
        w.monitor.close()
        w = None  # the model and its optimizer go before the cache is emptied
    free_device()
    ratios, aa = res["ratios"]["monitored"], res["aa"]
    q1, med, q3 = quartiles(ratios)
    return {"median_ratio": med, "iqr": (q1, q3), "aa": aa, "ratios": ratios,
            "noise_band": noise_band(aa, len(ratios)), "pairs": len(ratios),
            "verdict": verdict(med, aa, TARGETS[size], len(ratios), 0.0, 1.0),
            "target": TARGETS[size],
            "plain_step_ms": step_ms, "block_steps": block,
            "config": {"batch_size": cfg.batch_size, "seq_len": cfg.seq_len,
                       "layers": cfg.layers, "dim": cfg.dim, "attention": cfg.attention}}


def _outcome(m: dict[str, Any]) -> Outcome:
    target = m["target"]
    ok = m["verdict"] == "met" or (m["verdict"].startswith("inside noise")
                                   and m["median_ratio"] >= target)
    return Outcome.check(ok, f"monitored / plain {m['median_ratio']:.3f} (IQR "
                             f"{m['iqr'][0]:.3f}–{m['iqr'][1]:.3f}, {m['pairs']} pairs of "
                             f"{m['block_steps']}-step blocks, noise band ±{m['noise_band']:.3f}"
                             f") at {m['plain_step_ms']:.2f} ms/step: {m['verdict']} (target "
                             f"≥ {target})", **m)


@claim(group="overhead", needs_s=30, priority=70)
def step_overhead_default_gpt(ctx: Ctx) -> Outcome:
    """memtop's per-step cost on CUDA, default GPT (B=16, T=128, fp16 + GradScaler, fused
    AdamW): monitored / plain tokens/s ≥ 0.99, median of 15 interleaved pairs judged against the
    A/A noise"""
    return _outcome(measure(ctx, "default"))


@claim(group="overhead", needs_s=30, priority=71)
def step_overhead_large_gpt(ctx: Ctx) -> Outcome:
    """the same at a larger GPU step (B=32, T=512, 8 layers, dim 512, sdpa): ≥ 0.995, median of
    9 pairs"""
    return _outcome(measure(ctx, "large"))
