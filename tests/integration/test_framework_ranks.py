"""The callbacks under two ranks (torch's own launcher, gloo on CPU): HF's Trainer through
accelerate, Lightning's DDP strategy. Every rank writes its own metrics-rank-K.jsonl into one
run folder that rank 0 made and the framework's broadcast handed over; rank 0 writes
config.json; the report covers both ranks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from factories import ROOT, metrics_rows, subprocess_env

pytestmark = pytest.mark.slow

STEPS = 8
HF = f"""
import sys
sys.path.insert(0, {str(ROOT / "examples")!r})
import hf_trainer
from probes.integrations.transformers import MemtopCallback
memtop = MemtopCallback()
trainer = hf_trainer.make_trainer(sys.argv[1], steps={STEPS}, logging_steps=4, eval_steps=None,
                                  save_steps=None, callbacks=[memtop])
trainer.train()
rank = trainer.args.process_index
open(sys.argv[1] + f"-rank-{{rank}}.txt", "w").write(str(memtop.driver.last_run))
"""
LIGHTNING = f"""
import sys
sys.path.insert(0, {str(ROOT / "examples")!r})
import lightning.pytorch as pl
import lightning_fit
from probes.integrations.lightning import MemtopCallback
memtop = MemtopCallback()
trainer = pl.Trainer(max_steps={STEPS}, accumulate_grad_batches=2, accelerator="cpu",
                     devices=2, strategy="ddp", logger=False, enable_progress_bar=False,
                     enable_model_summary=False, enable_checkpointing=False,
                     default_root_dir=sys.argv[1], callbacks=[memtop])
trainer.fit(lightning_fit.make_module(), lightning_fit.loaders({STEPS}, 2)[0])
rank = trainer.global_rank
open(sys.argv[1] + f"-rank-{{rank}}.txt", "w").write(str(memtop.driver.last_run))
"""


@pytest.mark.parametrize("framework", ["transformers", "lightning"])
def test_two_ranks_write_one_folder(framework, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(HF if framework == "transformers" else LIGHTNING)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(script), str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=subprocess_env(), stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    # each rank names its run folder in a file of its own (their prints interleave on one pipe)
    folders = {(tmp_path / f"out-rank-{rank}.txt").read_text() for rank in (0, 1)}
    assert len(folders) == 1, folders  # both ranks wrote into the folder rank 0 made
    (run,) = (out / "memtop").iterdir()
    assert str(run) in folders
    for rank in (0, 1):
        steps, events = metrics_rows(run, f"metrics-rank-{rank}.jsonl")
        assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
        assert {r["rank"] for r in steps} == {rank}
        assert all(r["micro_batches"] == 2 for r in steps)
        assert events[0]["event"] == "run_started" and events[0]["world_size"] == 2
        assert events[-1]["reason"] == "finished"
    assert not (run / "metrics.jsonl").exists()
    config = json.loads((run / "config.json").read_text())
    assert config["framework"] == framework
    report = json.loads((run / "report.json").read_text())
    assert report["ranks"]["count"] == 2
