"""gpu_check's check of the framework callbacks on CUDA (probes/integrations/): what the CPU
tests cannot show. The HF Trainer (bf16 and fp16, accelerate's GradScaler) and Lightning
(16-mixed) over examples/hf_trainer.py's and examples/lightning_fit.py's models, each with and
without MemtopCallback, syncs counted per optimizer step with torch's sync-debug warnings.

Claims (benchmarks/gpu/registry.py): one row per optimizer step with the amp the framework
trains in and both micro-batches; in bf16 the callback adds no device sync per step to HF's own,
in fp16 at most one (the GradScaler's scale, read at the step's end); Lightning 16-mixed rows
carry the GradScaler's scale. The frameworks come from the carried wheels on the GPU box; where
one is missing the claims say NOT RUN.
"""

from __future__ import annotations

import statistics
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu.registry import Ctx, Outcome, claim
from benchmarks.harness.examples import example
from probes import records as R

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
    hf_trainer = example("hf_trainer")
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
    lightning_fit = example("lightning_fit")

    from probes.integrations.lightning import MemtopCallback

    cb = MemtopCallback(listen=False)
    trainer = lightning_fit.make_trainer(tmp / "pl", steps=STEPS, val_every=None,
                                         callbacks=[cb], checkpoints=False,
                                         precision="16-mixed", accelerator="cuda")
    train, _ = lightning_fit.loaders(STEPS, 2)
    trainer.fit(lightning_fit.make_module(), train)
    return cb.driver.last_run


FRAMEWORKS = ("transformers", "accelerate", "lightning")  # where one is missing: NOT RUN


def hf_figures(ctx: Ctx) -> dict[str, Any]:
    """HF bf16 and fp16, each without and with the callback: syncs per step, the fp16 rows."""
    def make() -> dict[str, Any]:
        out: dict[str, Any] = {}
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            for amp in ("bf16", "fp16"):
                plain, _ = hf_run(tmp, amp, memtop=False)
                watched, run = hf_run(tmp, amp, memtop=True)
                a, b = plain.per_step(), watched.per_step()
                steps, _ = _rows(run) if run else ([], [])
                out[amp] = {"without": a, "with": b,
                            "added": None if a is None or b is None else b - a,
                            "rows": len(steps),
                            "micro_batches": sorted({s.get("micro_batches") for s in steps}),
                            "amps": sorted({str(s.get("amp")) for s in steps}),
                            "scales_known": all(s.get("scale") is not None for s in steps)}
        return out

    return ctx.shared("frameworks_hf", make)


@claim("hf_rows_on_cuda", f"the HF Trainer in fp16 with MemtopCallback gives {STEPS} rows, each "
       "with both micro-batches, amp fp16 and accelerate's GradScaler scale", group="frameworks",
       needs_s=60, priority=70, requires=FRAMEWORKS)
def hf_rows_on_cuda(ctx: Ctx) -> Outcome:
    d = hf_figures(ctx)["fp16"]
    ok = d["rows"] == STEPS and d["micro_batches"] == [2] and d["amps"] == ["fp16"] \
        and d["scales_known"]
    return Outcome.check(ok, f"{d['rows']} rows, micro-batches {d['micro_batches']}, amp "
                             f"{d['amps']}, scale known {d['scales_known']}", **d)


@claim(group="frameworks", needs_s=60, priority=70, requires=FRAMEWORKS)
def hf_bf16_no_added_sync(ctx: Ctx) -> Outcome:
    """in bf16 MemtopCallback adds no device sync per optimizer step to the HF Trainer's own
    (torch's sync-debug warnings counted per step)"""
    return _syncs_added(ctx, "bf16", at_most=0)


@claim(group="frameworks", needs_s=60, priority=70, requires=FRAMEWORKS)
def hf_fp16_one_sync_at_most(ctx: Ctx) -> Outcome:
    """in fp16 MemtopCallback adds at most one device sync per optimizer step (the GradScaler's
    scale, read at the step's end)"""
    return _syncs_added(ctx, "fp16", at_most=1)


def _syncs_added(ctx: Ctx, amp: str, at_most: int) -> Outcome:
    d = hf_figures(ctx)[amp]
    return Outcome.check(d["added"] is not None and d["added"] <= at_most,
                         f"median syncs per step {d['without']} without, {d['with']} with", **d)


@claim("lightning_16_mixed_rows", f"Lightning 16-mixed with MemtopCallback gives {STEPS} rows with "
       "amp fp16 and the GradScaler's scale, and ends with run_finished", group="frameworks",
       needs_s=45, priority=70, requires=FRAMEWORKS)
def lightning_16_mixed_rows(ctx: Ctx) -> Outcome:
    with tempfile.TemporaryDirectory() as tmp_name:
        run = lightning_run(Path(tmp_name))
        steps, events = _rows(run) if run else ([], [])
    ok = (len(steps) == STEPS and all(s["amp"] == "fp16" and s["scale"] is not None
                                      for s in steps)
          and any(e["event"] == R.RUN_FINISHED for e in events))
    return Outcome.check(ok, f"{len(steps)} rows, scale {steps[-1]['scale'] if steps else None}",
                         rows=len(steps))
