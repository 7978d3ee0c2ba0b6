"""`memtop infer`'s configuration: one dataclass that validates itself with plain sentences.

No torch at import, like TrainConfig (trainer/config.py), whose device/amp resolution it shares.
The model's shape comes from the weights' header when ``weights`` is given (any shape option
given as well must agree with it), else from the options, else from TrainConfig's defaults.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from trainer.choices import AMP_MODES, ATTENTION_KINDS
from trainer.config import TrainConfig, check_device_text

if TYPE_CHECKING:
    import torch

    from trainer.model import GPTConfig

PROFILE_PHASES = ("auto", "both", "prefill", "decode", "none")
_SHAPE = {"layers": "n_layer", "heads": "n_head", "dim": "n_embd", "block_size": "block_size",
          "attention": "attention"}  # option -> GPTConfig field


@dataclass
class InferConfig:
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    amp: str = "auto"  # auto: as TrainConfig (no GradScaler: nothing is trained)
    weights: str | None = None  # a `memtop train` run folder or its weights.pt; None = fresh
    batch_size: int = 8  # B: concurrent sequences per request
    prompt_len: int = 64  # tokens of each prompt (read by the prefill)
    new_tokens: int = 64  # tokens generated per sequence (1 by the prefill, the rest decode)
    requests: int = 4  # rounds of B sequences; request 1 is the warm-up
    top_k: int = 0  # 0 = greedy; else sample among the k likeliest with the seed
    temperature: float = 1.0
    seed: int = 1337
    layers: int | None = None  # the model's shape: from the weights, else these, else the
    heads: int | None = None  # training defaults (trainer/config.py)
    dim: int | None = None
    block_size: int | None = None
    attention: str | None = None
    baseline_tokens: int = 8  # cache-off baseline: tokens made both ways at the end; 0 = skip
    # profiler windows: auto | both | prefill | decode | none, in request 2 (the first warms
    # up); auto = both, but none with one request: a window in the only request would be in
    # its TTFT, decode times and admission (issue 44). One asked for then runs in request 1.
    profile_phase: str = "auto"
    profile_active: int = 3  # decode steps the decode window records
    # a memory window (trainer/infer_window.py) in this request; None = only on the `a` key
    attribute_request: int | None = None
    max_memory_bytes: int | None = None  # the admission budget; default the device's total
    run_dir: str = "runs"

    def __post_init__(self) -> None:
        for name in ("batch_size", "prompt_len", "new_tokens", "requests", "profile_active"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{_flag(name)} must be a positive integer, got {value}")
        for name in ("layers", "heads", "dim", "block_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"{_flag(name)} must be a positive integer, got {value}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"--top-k must be zero (greedy) or a positive integer, "
                             f"got {self.top_k}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"--temperature must be a positive number, got {self.temperature}")
        if not isinstance(self.baseline_tokens, int) or self.baseline_tokens < 0:
            raise ValueError(f"--baseline-tokens must be zero or a positive integer, "
                             f"got {self.baseline_tokens}")
        if self.baseline_tokens > self.new_tokens:
            raise ValueError(f"--baseline-tokens {self.baseline_tokens} is more than "
                             f"--new-tokens {self.new_tokens}")
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"--seed must be between 0 and 2**63 - 1, got {self.seed}")
        if self.amp not in AMP_MODES:
            raise ValueError(f"unknown amp mode {self.amp!r}; use one of {', '.join(AMP_MODES)}")
        if self.attention is not None and self.attention not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention {self.attention!r}; "
                             f"use one of {', '.join(ATTENTION_KINDS)}")
        if self.profile_phase not in PROFILE_PHASES:
            raise ValueError(f"unknown profile phase {self.profile_phase!r}; "
                             f"use one of {', '.join(PROFILE_PHASES)}")
        self._check_attribute_request()
        if self.max_memory_bytes is not None and self.max_memory_bytes <= 0:
            raise ValueError("--max-memory must be greater than zero")
        check_device_text(self.device)
        if self.weights is None:
            self.check_fits(self.fresh_model_config())

    def profiled_request(self) -> int | None:
        """The request the --profile-phase windows trace (None: no window is armed)."""
        if self.profile_phase == "none" or (self.profile_phase == "auto" and self.requests < 2):
            return None
        return 2 if self.requests >= 2 else 1

    def _check_attribute_request(self) -> None:
        n = self.attribute_request
        if n is None:
            return
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            raise ValueError(f"--attribute-request must be a positive integer, got {n}")
        if n > self.requests:
            raise ValueError(f"--attribute-request {n} is past the last request "
                             f"(--requests {self.requests})")
        if n == 1:
            raise ValueError("--attribute-request 1 is the warm-up request, whose prefill "
                             "sizes admission; pick 2 or later (with --requests 2 or more)")
        if n == self.profiled_request():
            raise ValueError(f"--attribute-request {n} is the request the profiler windows "
                             f"trace; pick another or add --profile-phase none")

    # the model -----------------------------------------------------------------------------
    def fresh_model_config(self) -> GPTConfig:
        """The shape of a freshly initialised model: the options, else the training defaults."""
        from trainer.model import GPTConfig

        train = TrainConfig.from_options({opt: getattr(self, opt) for opt in _SHAPE
                                          if getattr(self, opt) is not None})
        return GPTConfig(**{field: getattr(train, opt) for opt, field in _SHAPE.items()})

    def check_against(self, weights: GPTConfig, source: str) -> None:
        """Every shape option given must be the weights' own (they cannot be changed)."""
        for opt, field in _SHAPE.items():
            mine, theirs = getattr(self, opt), getattr(weights, field)
            if mine is not None and mine != theirs and opt != "attention":
                raise ValueError(f"{_flag(opt)} {mine} does not match the weights in {source} "
                                 f"({opt.replace('_', ' ')} {theirs}); leave it out to use "
                                 "the weights' own")
        self.follow_block(weights.block_size)
        self.check_fits(weights)

    # options that follow the typed ones -----------------------------------------------------
    @classmethod
    def from_options(cls, typed: dict[str, Any]) -> InferConfig:
        """The config of the options a user typed; the others take their defaults, or follow
        a typed value their default would contradict (TrainConfig.from_options does the same
        for training): prompt and new tokens fit a typed --block-size (or the weights', once
        read: ``follow_block``), a fresh model's block grows to a typed prompt + new tokens,
        --baseline-tokens is at most --new-tokens. Only two typed values can conflict, and
        the error then names both."""
        values = dict(typed)
        base = cls()
        asked = typed.get("baseline_tokens")
        if "new_tokens" not in typed and isinstance(asked, int) and asked > base.new_tokens:
            values["new_tokens"] = asked  # as many new tokens as the baseline makes
        if "weights" not in typed and "block_size" not in typed:
            context = TrainConfig().block_size  # a fresh model's, unless more is typed
            needed = values.get("prompt_len", base.prompt_len) + values.get("new_tokens",
                                                                            base.new_tokens)
            if isinstance(needed, int) and needed > context:
                values["block_size"] = needed
        config = cls(**_lengths(values, typed, typed.get("block_size"), base))
        config._typed = frozenset(typed)
        return config

    def follow_block(self, block_size: int) -> None:
        """Prompt, new and baseline tokens the user did not type follow the weights' block."""
        typed = getattr(self, "_typed", None)
        if typed is None:  # built directly: every value is as given
            return
        values = _lengths(dataclasses.asdict(self), {k: getattr(self, k) for k in typed},
                          block_size, type(self)())
        for name in ("prompt_len", "new_tokens", "baseline_tokens"):
            setattr(self, name, values[name])

    def check_fits(self, model: GPTConfig) -> None:
        total = self.prompt_len + self.new_tokens
        if self.prompt_len >= model.block_size:
            raise ValueError(f"--prompt-len {self.prompt_len} leaves no room for a new token in "
                             f"the model's block size {model.block_size} (its position table "
                             "ends there)")
        if total > model.block_size:
            raise ValueError(f"--prompt-len {self.prompt_len} + --new-tokens {self.new_tokens} "
                             f"= {total} tokens is past the model's block size "
                             f"{model.block_size} (its position table ends there)")

    # the machine ---------------------------------------------------------------------------
    @cached_property
    def torch_device(self) -> torch.device:
        from trainer.config import resolve_device

        return resolve_device(self.device)

    @cached_property
    def amp_mode(self) -> str:
        from trainer.config import resolve_amp

        return resolve_amp(self.amp, self.torch_device)

    def resolve(self) -> tuple[torch.device, str]:
        return self.torch_device, self.amp_mode

    def to_json(self) -> dict[str, Any]:
        return {"mode": "infer", **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InferConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class ModelSpec:
    """What the model will be, settled on the main thread before anything runs."""

    config: GPTConfig
    state: dict[str, torch.Tensor] | None  # None: freshly initialised
    source: str  # the weights file, or "fresh (random init)"
    warning: str | None = None


def prepare_model(cfg: InferConfig) -> ModelSpec:
    """Read and check the weights (header, names, shapes) or plan a fresh model; ValueError
    (one sentence) when they do not fit. Reads tensors, computes nothing."""
    if cfg.weights is None:
        return ModelSpec(cfg.fresh_model_config(), None, "fresh (random init)",
                         "no --weights: the model is freshly initialised, so its tokens are "
                         "noise; memory and time are those of a trained model of this shape")
    from probes.runfolder import find_weights
    from trainer.checkpoint import header_config, read_weights

    path = find_weights(cfg.weights)
    header, state = read_weights(path)
    config = header_config(header)
    cfg.check_against(config, str(path))
    if cfg.attention is not None:
        config = dataclasses.replace(config, attention=cfg.attention)
    return ModelSpec(config, state, str(path))


def _lengths(values: dict[str, Any], typed: dict[str, Any], block: Any,
             base: InferConfig) -> dict[str, Any]:
    """``values`` with the token counts not typed fitted to a known ``block`` (a prompt at most
    half of it, new tokens the rest) and a baseline at most the new tokens."""
    values = dict(values)
    if isinstance(block, int) and block > 1:
        if "prompt_len" not in typed:
            values["prompt_len"] = min(base.prompt_len, block // 2)
        room = block - values["prompt_len"] if isinstance(values.get("prompt_len"), int) else 0
        if "new_tokens" not in typed and room > 0:
            values["new_tokens"] = min(base.new_tokens, room)
    new = values.get("new_tokens", base.new_tokens)
    if "baseline_tokens" not in typed and isinstance(new, int) and new > 0:
        values["baseline_tokens"] = min(base.baseline_tokens, new)
    return values


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")
