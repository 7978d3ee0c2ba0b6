"""A Hugging Face Trainer run watched by memtop: one line, ``callbacks=[MemtopCallback()]``.

    pip install -e '.[transformers]'
    python examples/hf_trainer.py --steps 60 --grad-accum 2       # CPU, well under a minute
    memtop view out/hf/memtop                                     # in another terminal

A small GPT-2 built from ``GPT2Config`` (no weights downloaded: nothing leaves the machine) learns
a synthetic token pattern with the real ``transformers.Trainer``: gradient accumulation,
evaluation and checkpoints on HF's schedule. memtop writes its run folder under
``OUTPUT_DIR/memtop/``; the tests (tests/integration/test_hf_trainer.py) and the callback's
cost benchmark (benchmarks/cases/frameworks/) build the same model and data from here.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_name, "1")  # a model from a config: nothing is fetched
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

VOCAB, SEQ = 256, 32


def tiny_gpt2(layers: int = 2, dim: int = 64, seed: int = 0) -> torch.nn.Module:
    """GPT-2 of ``layers`` blocks and width ``dim`` over a 256-token vocabulary, freshly
    initialised from its config."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(n_layer=layers, n_head=2, n_embd=dim, vocab_size=VOCAB,
                        n_positions=2 * SEQ, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


class Sequences(torch.utils.data.Dataset):
    """``n`` sequences of ``SEQ`` tokens, each an arithmetic progression mod the vocabulary
    from a random start (learnable), as HF's dicts: input_ids and labels (HF shifts them)."""

    def __init__(self, n: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=gen)
        self.ids = (start + 3 * torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def make_trainer(output_dir: str | Path, *, steps: int, grad_accum: int = 2, batch_size: int = 4,
                 logging_steps: int = 5, eval_steps: int | None = 10,
                 save_steps: int | None = 20, callbacks: list | None = None,
                 bf16: bool = False, fp16: bool = False, cpu: bool = True,
                 model: torch.nn.Module | None = None) -> object:
    """The real ``transformers.Trainer`` over the tiny GPT-2, on CPU unless ``cpu=False``
    (``callbacks`` as given: memtop's goes there)."""
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(output_dir), max_steps=steps, per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=batch_size, gradient_accumulation_steps=grad_accum,
        learning_rate=1e-3, logging_steps=logging_steps,
        eval_strategy="steps" if eval_steps else "no", eval_steps=eval_steps,
        save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500,
        use_cpu=cpu, bf16=bf16, fp16=fp16, report_to=[], disable_tqdm=True, seed=0,
        dataloader_num_workers=0)
    return Trainer(model=model if model is not None else tiny_gpt2(), args=args,
                   train_dataset=Sequences(batch_size * grad_accum * min(steps, 50)),
                   eval_dataset=Sequences(4 * batch_size, seed=1) if eval_steps else None,
                   callbacks=callbacks or [])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="A Hugging Face Trainer run watched by memtop.")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps (default: 60)")
    p.add_argument("--grad-accum", type=int, default=2,
                   help="gradient_accumulation_steps (default: 2)")
    p.add_argument("--output-dir", default="out/hf", help="HF's output_dir (default: out/hf)")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (fast on CPUs with "
                   "native bf16 only)")
    args = p.parse_args(argv)
    if min(args.steps, args.grad_accum) < 1:
        p.error("--steps and --grad-accum must be at least 1")
    try:
        from probes.integrations.transformers import MemtopCallback  # memtop
    except ImportError as err:  # memtop's FrameworkMissing says which extra to install
        print(f"hf_trainer: {err}", file=sys.stderr)
        return 2
    memtop = MemtopCallback()                                        # memtop: the one line
    trainer = make_trainer(args.output_dir, steps=args.steps, grad_accum=args.grad_accum,
                           bf16=args.bf16, callbacks=[memtop])
    result = trainer.train()
    run = memtop.driver.last_run
    print(f"hf_trainer: {result.global_step} optimizer steps of {args.grad_accum} micro-batches; "
          f"memtop run folder: {run}; report: {run / 'report.md' if run else 'n/a'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
