"""The values memtop's options can take, shared by the model (trainer/model.py), the configs
(trainer/config.py, trainer/infer_config.py) and the CLI's ``{a,b}`` choices. No imports: the
model file imports nothing of memtop that imports it back, and building the CLI's parser never
imports torch."""

from __future__ import annotations

AMP_MODES = ("auto", "off", "bf16", "fp16")
LEAK_KINDS = ("graph", "logits")
ATTENTION_KINDS = ("explicit", "sdpa")  # explicit: B×nh×T×T scores stored; sdpa: fused kernel
VOCAB_SIZE = 256  # byte-level: every byte value is a token (trainer/model.py GPTConfig)
