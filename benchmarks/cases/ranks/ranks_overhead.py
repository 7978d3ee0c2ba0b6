"""Per-rank monitoring overhead under DDP: a plain 2-rank DDP loop vs `memtop train --nproc 2`.

Both sides run under torch.distributed.run with gloo on CPU, the same OpenMP threads per rank
(trainer/launch.py shares the cores out) and the same model, data (seed + rank) and AMP. The
memtop side is the real launcher (RankLaunch: trainer.rank with every instrument, per-rank
metrics files, sockets); the plain side is this module's ``--worker`` under torchrun
(``-m benchmarks.cases.ranks.ranks_overhead``). Launches are interleaved in rounds [plain,
memtop, plain'] with the A/A noise of the same round (benchmarks/harness/pairs.py), on the ranks'
mean tokens/s over the timed steps.

    python -m benchmarks run ranks_overhead [--pairs 7] [--steps 60] [--warm 10] [--model JSON]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.harness import RATIO_HEADER, ROOT, BadInput, median, publish, run_pairs
from trainer.config import TrainConfig

NPROC = 2
TARGET = 0.99  # as single-process headless vs plain (the overhead case)


def worker(out: Path, config: dict, warm: int, steps: int) -> None:
    """One rank of the plain side: DDP, AdamW, AMP, loss.item() per step; no probes."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from trainer.data import BatchSampler, load_corpus
    from trainer.loop import AMP_DTYPES
    from trainer.model import GPT

    cfg = TrainConfig.from_json(config)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    box: dict = {}

    def train() -> None:  # on a background thread, as memtop's trainer runs
        torch.manual_seed(cfg.seed)
        model = DistributedDataParallel(GPT(cfg.model_config()))
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.1)
        batches = BatchSampler(load_corpus(), cfg.batch_size, cfg.seq_len, cfg.seed + rank,
                               torch.device("cpu"))
        dtype = AMP_DTYPES.get(cfg.amp_mode)
        t0 = 0.0
        for step in range(warm + steps):
            if step == warm:
                t0 = time.perf_counter()
            x, y = batches.next_batch()
            with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
                _, loss = model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss.item()
        box["tps"] = steps * cfg.batch_size * cfg.seq_len / (time.perf_counter() - t0)

    t = threading.Thread(target=train)
    t.start()
    t.join()
    dist.destroy_process_group()
    (out / f"rank-{rank}.json").write_text(json.dumps({"tokens_per_s": box["tps"]}))


def plain_side(cfg: TrainConfig, warm: int, steps: int) -> list[float]:
    from trainer.launch import rank_threads

    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        env.setdefault("OMP_NUM_THREADS", str(rank_threads(NPROC)))
        env.setdefault("MKL_NUM_THREADS", env["OMP_NUM_THREADS"])
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", str(NPROC), "-m", __name__, "--worker", tmp, "--config",
                        json.dumps(cfg.to_json()), "--warm", str(warm), "--steps", str(steps)],
                       check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        return [json.loads((Path(tmp) / f"rank-{k}.json").read_text())["tokens_per_s"]
                for k in range(NPROC)]


def memtop_side(cfg: TrainConfig, warm: int, steps: int) -> list[float]:
    from probes.runfolder import create_run_dir
    from trainer.launch import RankLaunch

    with tempfile.TemporaryDirectory() as tmp:
        run_cfg = dataclasses.replace(cfg, steps=warm + steps, run_dir=tmp, nproc=NPROC)
        run_dir = create_run_dir(tmp)
        launch = RankLaunch(run_cfg, run_dir)
        launch.start()
        if launch.wait() != 0:
            raise RuntimeError(f"memtop side failed; see {run_dir}/torchrun.log")
        out = []
        for k in range(NPROC):
            rows = [json.loads(x) for x in (run_dir / f"metrics-rank-{k}.jsonl").open()]
            t = {r["step"]: r["time_s"] for r in rows if "event" not in r}
            out.append(steps * cfg.batch_size * cfg.seq_len / (t[warm + steps] - t[warm]))
        return out


def options(ap) -> None:
    ap.pairs(7, "plain, memtop, plain'")
    ap.quiet()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warm", type=int, default=10)
    ap.add_argument("--model", default="",
                    help="TrainConfig fields as JSON, e.g. '{\"layers\": 2}' (default: "
                         "the default model)")


def main(args) -> None:
    try:
        cfg = TrainConfig(device="cpu", run_dir=tempfile.gettempdir(),
                          **json.loads(args.model or "{}"))
    except (ValueError, TypeError) as exc:
        raise BadInput(f"--model: {exc}") from None
    per_rank: dict[str, list[list[float]]] = {"plain": [], "memtop": []}

    def side(name: str, fn):
        def run() -> float:
            got = fn(cfg, args.warm, args.steps)
            per_rank[name].append(got)
            return sum(got) / len(got)  # the ranks' mean tokens/s: one figure per launch
        return run

    pairs = run_pairs(args, "plain", {"plain": side("plain", plain_side),
                                      "memtop": side("memtop", memtop_side)},
                      unit="tok/s per rank", fmt="7,.0f")
    what = "memtop --nproc 2 / plain 2-rank DDP, tokens/s per rank"
    row, _ = pairs.row("memtop", what, TARGET)
    lines = ["| rank | plain DDP tok/s (median) | memtop tok/s (median) |", "|---|---|---|"]
    for k in range(NPROC):
        p = [r[k] for r in per_rank["plain"]]
        o = [r[k] for r in per_rank["memtop"]]
        lines.append(f"| {k} | {median(p):,.0f} | {median(o):,.0f} |")
    table = f"{RATIO_HEADER}\n{row}\n\n" + "\n".join(lines)
    body = (f"Config: `memtop train` model (B={cfg.batch_size}, T={cfg.seq_len}, "
            f"{cfg.layers} layers, dim {cfg.dim}, amp {cfg.amp}), {NPROC} gloo ranks on CPU "
            f"under torch.distributed.run, OpenMP threads shared out; {args.warm} warm-up then "
            f"{args.steps} timed steps per launch; {args.pairs} rounds of [plain, memtop, plain'] "
            f"(odd rounds reversed), A/A = plain'/plain. {pairs.note()}\n\n{table}")
    publish(args, "Per-rank overhead: plain 2-rank DDP vs memtop train --nproc 2", body,
            [pairs.figure("ranks_overhead/per_rank", what, "memtop", TARGET)], shown=table)


if __name__ == "__main__":  # one rank of the plain side, under torchrun (plain_side)
    worker_args = argparse.ArgumentParser()
    for flag in ("--worker", "--config"):
        worker_args.add_argument(flag, required=True)
    worker_args.add_argument("--warm", type=int, required=True)
    worker_args.add_argument("--steps", type=int, required=True)
    a = worker_args.parse_args()
    worker(Path(a.worker), json.loads(a.config), a.warm, a.steps)
