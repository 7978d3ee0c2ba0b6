"""gpu_check's check of the framework callbacks on CUDA (probes/integrations/): what the CPU
tests cannot show. The HF Trainer (bf16 and fp16, accelerate's GradScaler) and Lightning
(16-mixed) over examples/hf_trainer.py's and examples/lightning_fit.py's models, each with and
without MemtopCallback, syncs counted per optimizer step with torch's sync-debug warnings.

Claims (gpu_check.CLAIMS["frameworks"]): one row per optimizer step with the amp the framework
trains in and both micro-batches; in bf16 the callback adds no device sync per step to HF's own,
in fp16 at most one (the GradScaler's scale, read at the step's end); Lightning 16-mixed rows
carry the GradScaler's scale.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import common
import torch

from probes import records as R

sys.path.insert(0, str(common.ROOT / "examples"))
STEPS, SKIP = 20, 5


class SyncMarks:
    """Sync-debug warnings seen so far, read at each optimizer step's end."""

    def __init__(self, caught: list) -> None:
        self.caught = caught
        self.at_step_end: list[int] = []

    def mark(self) -> None:
        self.at_step_end.append(sum("synchroniz" in str(w.message).lower()
                                    for w in self.caught))

    def per_step(self) -> float | None:
        marks = self.at_step_end[SKIP:]
        deltas = [b - a for a, b in zip(marks, marks[1:], strict=False)]
        return statistics.median(deltas) if deltas else None


def _counted(train) -> SyncMarks:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        syncs = SyncMarks(caught)
        torch.cuda.set_sync_debug_mode("warn")
        try:
            train(syncs)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return syncs


def _rows(run: Path) -> tuple[list[dict], list[dict]]:
    from probes.runfolder import read_metrics

    steps, events, _ = read_metrics(run / "metrics.jsonl")
    return steps, events


def hf_run(tmp: Path, amp: str, memtop: bool) -> tuple[SyncMarks, Path | None]:
    import hf_trainer
    from transformers import TrainerCallback

    from probes.integrations.transformers import MemtopCallback

    box: dict[str, Any] = {}

    def train(syncs: SyncMarks) -> None:
        class Marks(TrainerCallback):
            def on_step_end(self, *a, **k):
                syncs.mark()

        cb = MemtopCallback(listen=False) if memtop else None
        trainer = hf_trainer.make_trainer(
            tmp / f"hf-{amp}-{memtop}", steps=STEPS, logging_steps=10, eval_steps=None,
            save_steps=None, bf16=amp == "bf16", fp16=amp == "fp16", cpu=False,
            callbacks=[Marks()] + ([cb] if cb else []))
        trainer.train()
        box["run"] = cb.driver.last_run if cb else None

    return _counted(train), box.get("run")


def lightning_run(tmp: Path) -> Path | None:
    import lightning_fit

    from probes.integrations.lightning import MemtopCallback

    cb = MemtopCallback(listen=False)
    trainer = lightning_fit.make_trainer(tmp / "pl", steps=STEPS, val_every=None,
                                         callbacks=[cb], checkpoints=False,
                                         precision="16-mixed", accelerator="cuda")
    train, _ = lightning_fit.loaders(STEPS, 2)
    trainer.fit(lightning_fit.make_module(), train)
    return cb.driver.last_run


def check_frameworks(ctx: Any, r: Any) -> None:
    if not ctx.is_cuda:
        r.status, r.summary = "skip", "CUDA only (the CPU tests run both frameworks)"
        return
    missing = [m for m in ("transformers", "accelerate", "lightning")
               if importlib.util.find_spec(m) is None]
    if missing:
        r.status, r.summary = "skip", f"not installed: {', '.join(missing)}"
        return
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        added: dict[str, float | None] = {}
        for amp in ("bf16", "fp16"):
            plain, _ = hf_run(tmp, amp, memtop=False)
            watched, run = hf_run(tmp, amp, memtop=True)
            a, b = plain.per_step(), watched.per_step()
            added[amp] = None if a is None or b is None else b - a
            steps, events = _rows(run) if run else ([], [])
            r.figures[f"hf_{amp}"] = {"syncs_per_step_without": a, "with": b,
                                      "rows": len(steps)}
            if amp == "fp16":
                ok = (len(steps) == STEPS and all(s["micro_batches"] == 2 for s in steps)
                      and all(s["amp"] == "fp16" and s["scale"] is not None for s in steps))
                r.claim("hf_rows_on_cuda", ok, f"{len(steps)} rows, amp "
                        f"{steps[-1]['amp'] if steps else None}, scale "
                        f"{steps[-1]['scale'] if steps else None}")
        r.claim("hf_bf16_no_added_sync", added["bf16"] is not None and added["bf16"] <= 0,
                f"median syncs per step added: {added['bf16']}")
        r.claim("hf_fp16_one_sync_at_most", added["fp16"] is not None and added["fp16"] <= 1,
                f"median syncs per step added: {added['fp16']}")
        run = lightning_run(tmp)
        steps, events = _rows(run) if run else ([], [])
        ok = (len(steps) == STEPS and all(s["amp"] == "fp16" and s["scale"] is not None
                                          for s in steps)
              and any(e["event"] == R.RUN_FINISHED for e in events))
        r.claim("lightning_16_mixed_rows", ok, f"{len(steps)} rows, scale "
                f"{steps[-1]['scale'] if steps else None}")
    r.summary = (f"HF syncs added per step: bf16 {added['bf16']}, fp16 {added['fp16']}; "
                 f"Lightning 16-mixed {len(steps)} rows")
