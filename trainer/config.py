"""The training run's configuration: one dataclass that validates itself with plain sentences."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.data import corpus_bytes
from trainer.model import ATTENTION_KINDS, GPTConfig

AMP_MODES = ("auto", "off", "bf16", "fp16")
LEAK_KINDS = ("graph", "logits")
MAX_BLOCK_SIZE = 8192  # the causal mask is block_size² bools; the shipped text is ~8k bytes


def resolve_device(text: str) -> torch.device:
    """'auto' | 'cpu' | 'cuda' | 'cuda:N' -> a device that exists here, else ValueError."""
    text = text.strip().lower()
    if text == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    if text == "cuda" or text.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {text!r} asked for, but CUDA is not available here; "
                             "use --device cpu or auto")
        index = 0
        if text.startswith("cuda:"):
            try:
                index = int(text[5:])
            except ValueError:
                raise ValueError(f"device {text!r} is not of the form cuda:N") from None
        if not 0 <= index < torch.cuda.device_count():
            raise ValueError(f"device {text!r} does not exist: this machine has "
                             f"{torch.cuda.device_count()} CUDA device(s)")
        return torch.device(f"cuda:{index}")
    raise ValueError(f"unknown device {text!r}; use auto, cpu, cuda or cuda:N")


def resolve_amp(amp: str, device: torch.device) -> str:
    """'auto' -> fp16 (+GradScaler) on CUDA, bf16 on CPU; checks the dtype works on the device."""
    if amp not in AMP_MODES:
        raise ValueError(f"unknown amp mode {amp!r}; use one of {', '.join(AMP_MODES)}")
    if amp == "auto":
        return "fp16" if device.type == "cuda" else "bf16"
    if amp == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"bf16 is not supported on {torch.cuda.get_device_name(device)}; "
                         "use --amp fp16")
    return amp


@dataclass
class TrainConfig:
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    amp: str = "auto"  # auto | off | bf16 | fp16
    batch_size: int = 16  # B
    seq_len: int = 128  # T, tokens per sequence; at most block_size
    block_size: int = 128  # the model's longest context
    layers: int = 4
    heads: int = 4
    dim: int = 128
    attention: str = "explicit"  # explicit (B×nh×T×T scores) | sdpa
    steps: int = 300  # optimizer steps; 0 = until stopped
    lr: float = 1e-3
    seed: int = 1337
    warmup_steps: int = 5  # peak counters are reset after these steps
    grad_clip: float = 1.0  # clip_grad_norm_ max norm (on unscaled gradients); 0 = no clipping
    profile_wait: int = 1  # profiler schedule: steps skipped before warmup
    profile_warmup: int = 1  # steps traced but discarded
    profile_active: int = 3  # steps recorded
    profile_at: list[int] = field(default_factory=list)  # steps at which to open a window
    profile_memory: bool = False  # record allocations in the profiler window (costs more)
    profile_record_shapes: bool = False  # record input shapes (stopping the profiler costs ~3x)
    leak: str = "graph"  # leak demo kind: graph | logits
    leak_at: int | None = None  # start the leak demo at this step without a key press
    leak_stop_at: int | None = None  # and stop (fix) it at this step
    max_memory_bytes: int | None = None  # stop cleanly before the watched counter passes this
    run_dir: str = "runs"  # where runs/<timestamp>-<id>/ folders are created

    def __post_init__(self) -> None:
        positive = ("batch_size", "seq_len", "block_size", "layers", "heads", "dim",
                    "profile_active")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{_flag(name)} must be a positive integer, got {value}")
        for name in ("steps", "warmup_steps", "profile_wait", "profile_warmup"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{_flag(name)} must be zero or a positive integer, got {value}")
        if self.seq_len > self.block_size:
            raise ValueError(f"--seq-len {self.seq_len} is above the block size "
                             f"{self.block_size}; raise --block-size or lower --seq-len")
        if self.dim % self.heads != 0:
            raise ValueError(f"--dim {self.dim} must be divisible by --heads {self.heads}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"--lr must be a positive finite number, got {self.lr}")
        if not (math.isfinite(self.grad_clip) and self.grad_clip >= 0):
            raise ValueError(f"--grad-clip must be zero or a positive finite number, "
                             f"got {self.grad_clip}")
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"--seed must be between 0 and 2**63 - 1, got {self.seed}")
        if self.block_size > MAX_BLOCK_SIZE:
            raise ValueError(f"--block-size {self.block_size} is above {MAX_BLOCK_SIZE}; the "
                             "shipped text is shorter than that")
        if self.seq_len > corpus_bytes() - 2:
            raise ValueError(f"--seq-len {self.seq_len} is longer than the shipped text allows "
                             f"({corpus_bytes() - 2} tokens)")
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention {self.attention!r}; "
                             f"use one of {', '.join(ATTENTION_KINDS)}")
        if self.amp not in AMP_MODES:
            raise ValueError(f"unknown amp mode {self.amp!r}; use one of {', '.join(AMP_MODES)}")
        if self.leak not in LEAK_KINDS:
            raise ValueError(f"unknown leak kind {self.leak!r}; use one of {', '.join(LEAK_KINDS)}")
        for step in self.profile_at:
            if step <= 0:
                raise ValueError(f"--profile-at {step} must be a positive step number")
        if self.leak_at is not None and self.leak_at <= 0:
            raise ValueError(f"--leak-at {self.leak_at} must be a positive step number")
        if self.leak_stop_at is not None:
            if self.leak_at is None:
                raise ValueError("--leak-stop-at needs --leak-at")
            if self.leak_stop_at <= self.leak_at:
                raise ValueError(f"--leak-stop-at {self.leak_stop_at} must come after "
                                 f"--leak-at {self.leak_at}")
        if self.max_memory_bytes is not None and self.max_memory_bytes <= 0:
            raise ValueError("--max-memory must be greater than zero")
        self.torch_device = resolve_device(self.device)
        self.amp_mode = resolve_amp(self.amp, self.torch_device)

    def model_config(self) -> GPTConfig:
        return GPTConfig(block_size=self.block_size, n_layer=self.layers, n_head=self.heads,
                         n_embd=self.dim, attention=self.attention)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["resolved_device"] = str(self.torch_device)
        data["resolved_amp"] = self.amp_mode
        return data


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")
