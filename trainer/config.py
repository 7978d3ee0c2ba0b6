"""The training run's configuration: one dataclass that validates itself with plain sentences.

It imports no torch: a config loads (and `memtop train --help` runs) anywhere, and a CUDA run's
config.json reads on a laptop. The device is resolved only when a run starts (``resolve()``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from probes.counters.host import (
    CPU_BF16_ENV,
    NATIVE_BF16_FLAGS,
    bf16_emulated_why,
    cpu_bf16_override,
    read_cpu_flags,
)
from trainer.choices import AMP_MODES, ATTENTION_KINDS, LEAK_KINDS, VOCAB_SIZE
from trainer.corpus import corpus_bytes

if TYPE_CHECKING:
    import torch

    from trainer.model import GPTConfig

MAX_BLOCK_SIZE = 8192  # the causal mask is block_size² bools; the shipped text is ~8k bytes
_DEVICE_RE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


def check_device_text(text: str) -> None:
    """ValueError unless ``text`` is auto, cpu, cuda or cuda:N (whether it exists comes later)."""
    clean = text.strip().lower()
    if clean.startswith("cuda:") and not _DEVICE_RE.match(clean):
        raise ValueError(f"device {text!r} is not of the form cuda:N")
    if not _DEVICE_RE.match(clean):
        raise ValueError(f"unknown device {text!r}; use auto, cpu, cuda or cuda:N")


def resolve_device(text: str) -> torch.device:
    """'auto' | 'cpu' | 'cuda' | 'cuda:N' -> a device that exists here, else ValueError."""
    import torch

    check_device_text(text)
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


def bf16_problem(capability: tuple[int, int], name: str) -> str | None:
    """Why bf16 autocast should not run on a GPU of this compute capability, or None.

    bf16 tensor-core math starts with Ampere (sm 8.0). torch.cuda.is_bf16_supported() also says
    True on older GPUs where bf16 is only emulated (slowly), and it asks the *current* device,
    not the chosen one, so memtop checks the chosen device's capability itself.
    """
    major, minor = capability
    if major >= 8:
        return None
    return (f"bf16 is not native on {name} (compute capability {major}.{minor}; bf16 needs "
            "8.0 or newer and is only emulated, slowly, below it); use --amp fp16")


def auto_amp(device_type: str, cpu_flags: set[str],
             bf16_override: str | None = None) -> tuple[str, str]:
    """(amp mode, why) that ``--amp auto`` picks: fp16 + GradScaler on CUDA; on a CPU bf16 only
    where it is native (avx512_bf16, amx_bf16, aarch64 bf16), fp32 elsewhere, because emulated
    bf16 autocast is slower than fp32 (and with unknown flags, fp32: no guess).
    ``bf16_override`` (MEMTOP_CPU_BF16: native | emulated) stands in for the flags and is named
    in the reason. ``why`` is a short part, ";", then the detail: the header shows the short
    part, run_started the whole."""
    if device_type == "cuda":
        return "fp16", "auto: fp16 on CUDA; with a GradScaler"
    if bf16_override == "native":
        return "bf16", (f"auto: bf16, {CPU_BF16_ENV}=native; the variable says this CPU has "
                        "native bf16, whatever its flags say")
    if bf16_override == "emulated":
        return "off", (f"auto: fp32, {CPU_BF16_ENV}=emulated; the variable says bf16 is "
                       "emulated on this CPU, whatever its flags say (--amp bf16 forces it)")
    native = sorted(cpu_flags & NATIVE_BF16_FLAGS)
    if native:
        return "bf16", f"auto: native bf16; this CPU has {', '.join(native)}"
    if not cpu_flags:
        return "off", ("auto: fp32; this CPU's flags cannot be read, and bf16 autocast where it "
                       "is emulated is slower than fp32 (--amp bf16 forces it)")
    return "off", (f"auto: fp32, no native bf16; {bf16_emulated_why(cpu_flags)}, so bf16 "
                   "autocast would be emulated, slower than fp32 (--amp bf16 forces it)")


def _auto(device: torch.device) -> tuple[str, str]:
    if device.type != "cpu":
        return auto_amp(device.type, set())
    return auto_amp("cpu", read_cpu_flags(), cpu_bf16_override())


def amp_reason(amp: str, device: torch.device) -> str:
    """Why the run uses the amp mode it does (run_started's ``amp_reason``, the header)."""
    if amp == "auto":
        return _auto(device)[1]
    if amp == "bf16" and device.type == "cpu":
        problem = bf16_emulated_why(read_cpu_flags(), cpu_bf16_override())
        if problem:
            return f"asked for: --amp bf16, emulated; {problem}, so it runs slower than fp32"
    return f"asked for: --amp {amp}"


def resolve_amp(amp: str, device: torch.device) -> str:
    """'auto' -> auto_amp's choice; checks the dtype works on the device."""
    import torch

    if amp not in AMP_MODES:
        raise ValueError(f"unknown amp mode {amp!r}; use one of {', '.join(AMP_MODES)}")
    if amp == "auto":
        return _auto(device)[0]
    if amp == "bf16" and device.type == "cuda" and torch.version.hip is None:
        problem = bf16_problem(torch.cuda.get_device_capability(device),
                               torch.cuda.get_device_name(device))
        if problem:
            raise ValueError(problem)
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
    attribute_at: list[int] = field(default_factory=list)  # steps to open a memory window at
    attribute_steps: int = 1  # measured steps of a memory attribution window (after 1 warm-up)
    leak: str = "graph"  # leak demo kind: graph | logits
    leak_at: int | None = None  # start the leak demo at this step without a key press
    leak_stop_at: int | None = None  # and stop (fix) it at this step
    max_memory_bytes: int | None = None  # stop cleanly before the watched counter passes this
    memory_history: bool = False  # CUDA: record allocations (Python stacks) for snapshots
    run_dir: str = "runs"  # where runs/<timestamp>-<id>/ folders are created
    nproc: int = 1  # ranks on this machine under torch.distributed.run (DDP); 1 = no DDP
    port: int = 0  # rendezvous port for --nproc > 1; 0 = a free one (torchrun --standalone)
    save_weights: bool = True  # weights.pt in the run folder at the end (memtop infer reads it)
    baseline: str | None = None  # a run folder to compare with: live deltas, report section
    metrics_port: int | None = None  # serve /metrics for Prometheus (probes/export); 0 = free
    metrics_bind: str = "127.0.0.1"  # its address; /metrics has no authentication

    def __post_init__(self) -> None:
        positive = ("batch_size", "seq_len", "block_size", "layers", "heads", "dim",
                    "profile_active", "attribute_steps")
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
            if self.steps and step > self.steps:
                raise ValueError(f"--profile-at {step} is after the run's last step "
                                 f"(--steps {self.steps}): the window would never open")
        for step in self.attribute_at:
            if step <= 0:
                raise ValueError(f"--attribute-at {step} must be a positive step number")
            if self.steps and step + self.attribute_steps > self.steps:
                raise ValueError(f"--attribute-at {step} is too late for the run's last step "
                                 f"(--steps {self.steps}): its warm-up and "
                                 f"{self.attribute_steps} measured step(s) would not fit")
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
        check_device_text(self.device)
        if not isinstance(self.nproc, int) or self.nproc < 1:
            raise ValueError(f"--nproc must be a positive integer, got {self.nproc}")
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be between 0 and 65535, got {self.port}")
        if self.metrics_port is not None and (not isinstance(self.metrics_port, int)
                                              or not 0 <= self.metrics_port <= 65535):
            raise ValueError(f"--metrics-port must be between 0 and 65535 (0: a free one), "
                             f"got {self.metrics_port}")
        if not isinstance(self.metrics_bind, str) or not self.metrics_bind.strip():
            raise ValueError("--metrics-bind must be an address, such as 127.0.0.1")
        if self.nproc > 1 and self.device.strip().lower().startswith("cuda:"):
            raise ValueError(f"--device {self.device} names one GPU, but --nproc {self.nproc} "
                             "runs one rank per GPU; use --device cuda (or auto)")

    @classmethod
    def from_options(cls, typed: dict[str, Any], **defaults: Any) -> TrainConfig:
        """The config of the options a user typed. Every other option takes its default, or,
        where that default would contradict a typed value, the value that follows it: T at
        most a typed block size, a block at least a typed T, heads that divide a typed width, a
        width that typed heads divide, steps that reach the end of a typed --profile-at window.
        So only two typed values can conflict, and __post_init__'s error then names both.
        ``defaults``: the caller's own defaults for options not typed (the CLI's steps)."""
        values = {**defaults, **typed}
        base = cls()

        def given(name: str) -> Any:  # a typed positive integer, else None (checked later)
            value = typed.get(name)
            return value if isinstance(value, int) and value > 0 else None

        if "seq_len" not in typed and given("block_size"):
            values["seq_len"] = min(base.seq_len, typed["block_size"])
        if "block_size" not in typed and given("seq_len"):
            values["block_size"] = max(base.block_size, typed["seq_len"])
        if "heads" not in typed and (dim := given("dim")):
            values["heads"] = max(h for h in range(1, base.heads + 1) if dim % h == 0)
        if "dim" not in typed and (heads := given("heads")):
            values["dim"] = heads * -(-base.dim // heads)  # the default, or the next multiple
        steps, at = values.get("steps", base.steps), typed.get("profile_at") or []
        if "steps" not in typed and steps and at and all(isinstance(a, int) for a in at):
            window = sum(values.get(k, getattr(base, k)) for k in (
                "profile_wait", "profile_warmup", "profile_active"))
            if all(isinstance(w, int) for w in (window, steps)):
                values["steps"] = max(steps, max(at) + window)
        steps, at = values.get("steps", base.steps), typed.get("attribute_at") or []
        if "steps" not in typed and steps and at and all(isinstance(a, int) for a in at):
            window = values.get("attribute_steps", base.attribute_steps)  # + 1 warm-up step
            if all(isinstance(w, int) for w in (window, steps)):
                values["steps"] = max(steps, max(at) + window)
        values["profile_at"] = list(values.get("profile_at") or [])
        values["attribute_at"] = list(values.get("attribute_at") or [])
        return cls(**values)

    def resolve(self) -> tuple[torch.device, str]:
        """(device, amp mode) on this machine; ValueError when it lacks them. Imports torch."""
        return self.torch_device, self.amp_mode

    @cached_property
    def torch_device(self) -> torch.device:
        return resolve_device(self.device)

    @cached_property
    def amp_mode(self) -> str:
        return resolve_amp(self.amp, self.torch_device)

    def model_config(self) -> GPTConfig:
        from trainer.model import GPTConfig

        return GPTConfig(block_size=self.block_size, n_layer=self.layers, n_head=self.heads,
                         n_embd=self.dim, attention=self.attention)

    def param_count(self) -> int:
        """The GPT's parameters without building it (trainer/model.py; lm_head tied to the
        token table): vocab·D + block·D + L·(12·D² + 13·D) + 2·D. `memtop fit` sizes the
        model with it before torch is imported."""
        d, layers = self.dim, self.layers
        return VOCAB_SIZE * d + self.block_size * d + layers * (12 * d * d + 13 * d) + 2 * d

    def hook_options(self) -> dict[str, Any]:
        """The keywords of probes.monitor.default_hooks for this run's instruments: the
        profiler window's schedule, --profile-at and what the window records, and the memory
        attribution window's --attribute-at and measured steps."""
        return {"profile_schedule": (self.profile_wait, self.profile_warmup, self.profile_active),
                "profile_at": self.profile_at, "profile_memory": self.profile_memory,
                "profile_record_shapes": self.profile_record_shapes,
                "attribute_at": self.attribute_at, "attribute_steps": self.attribute_steps}

    def to_json(self) -> dict[str, Any]:
        """What config.json holds: the options as given. The machine that runs adds the
        resolved device and amp beside them (``resolved_device``, ``resolved_amp``) when the
        run starts (probes/runfolder/recorder.py ``add_to_config``); run_started has them too."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainConfig:
        """A config.json back into a validated config (unknown keys, e.g. from newer or older
        memtop versions, are ignored); ValueError when a value is not valid."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")
