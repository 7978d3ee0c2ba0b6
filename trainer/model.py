"""A small decoder-only GPT, in the spirit of nanoGPT's model.py: one file, no cleverness.

Attention comes in two forms. "explicit" materialises the (B, nh, T, T) score matrix, so memory
grows with T² as the tutorial explains; "sdpa" calls scaled_dot_product_attention, which may use
a fused kernel that never stores the full matrix. The explicit form is the default because memtop
is a tool for seeing memory, and T² is the term people most often miss.

Generation (tutorial §5.2) runs in two phases over a per-layer KV cache (:class:`KVCache`):
``prefill`` reads the whole prompt in one pass and fills the cache; ``decode_step`` feeds one
new token per sequence and attends over everything cached. ``generate`` strings them together,
and with ``use_cache=False`` recomputes the whole context for every token instead (the baseline
the cache is measured against).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.nn import functional as F

from trainer.choices import ATTENTION_KINDS, VOCAB_SIZE


@dataclass
class GPTConfig:
    vocab_size: int = VOCAB_SIZE  # byte-level: every byte value is a token, no tokenizer file
    block_size: int = 128  # longest context the position table covers
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # attention heads per block
    n_embd: int = 128  # model width D; must be divisible by n_head
    dropout: float = 0.0  # 0 keeps runs reproducible and the step cost steady
    attention: str = "explicit"  # "explicit" (stores B×nh×T×T scores) or "sdpa"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"dim {self.n_embd} must be divisible by heads {self.n_head} "
                f"(each head gets dim/heads channels)"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(
                f"attention must be one of {', '.join(ATTENTION_KINDS)}, got {self.attention!r}"
            )


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.attention = config.attention
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)  # q, k, v in one matmul
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        mask = torch.tril(torch.ones(config.block_size, config.block_size, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, config.block_size, config.block_size),
                             persistent=False)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0) \
            -> torch.Tensor:
        B, T, C = x.size()  # batch, sequence length, embedding dim
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.append(layer, k, v)  # (B, nh, past + T, hs): all keys/values so far
        S = past + T  # keys each query may see (the newest query sits at position S - 1)
        if self.attention == "sdpa":
            dropout = self.dropout if self.training else 0.0
            if past == 0:
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
            else:  # is_causal aligns top-left, so a chunk after the cache needs its own mask
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout,
                                                   attn_mask=self.mask[:, :, past:S, :S])
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, S)
            att = att.masked_fill(~self.mask[:, :, past:S, :S], float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v  # (B, nh, T, S) x (B, nh, S, hs) -> (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble heads: (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))  # (B, T, 4C) inside


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0) \
            -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache, layer)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as in GPT-2
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # scaled init of residual projections (GPT-2)
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T = idx.size()
        past = cache.length if cache is not None else 0
        if past + T > self.config.block_size:
            raise ValueError(f"sequence length {past + T} exceeds block size "
                             f"{self.config.block_size}")
        pos = torch.arange(past, past + T, dtype=torch.long, device=idx.device)  # (T,)
        tok_emb = self.transformer.wte(idx)  # (B, T, C)
        pos_emb = self.transformer.wpe(pos)  # (T, C)
        x = self.transformer.drop(tok_emb + pos_emb)
        for i, block in enumerate(self.transformer.h):
            x = block(x, cache, i)
        if cache is not None:
            cache.length += T  # every layer has appended its T new positions
        x = self.transformer.ln_f(x)
        if targets is None and cache is not None:
            x = x[:, -1:, :]  # generating: only the last position's logits are needed
        logits = self.lm_head(x)  # (B, T, vocab), or (B, 1, vocab) when generating
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    # generation ------------------------------------------------------------------------------
    def new_cache(self) -> KVCache:
        return KVCache(self.config.n_layer)

    def prefill(self, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """The prompt (B, T) in one pass, filling ``cache``; logits of the last position (B, V)."""
        logits, _ = self(idx, cache=cache)
        return logits[:, -1, :]

    def decode_step(self, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One new token per sequence (B, 1) over the cache; its logits (B, V)."""
        logits, _ = self(token, cache=cache)
        return logits[:, -1, :]

    def recompute_step(self, idx: torch.Tensor) -> torch.Tensor:
        """No cache: the whole context (B, T) again, for the next token's logits (B, V)."""
        logits, _ = self(idx)
        return logits[:, -1, :]

    @torch.inference_mode()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, *, use_cache: bool = True,
                 top_k: int = 0, temperature: float = 1.0,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Prompt (B, T) -> (B, T + max_new_tokens). Call model.eval() first (tutorial §2.4)."""
        if idx.size(1) + max_new_tokens > self.config.block_size:
            raise ValueError(f"{idx.size(1)} prompt + {max_new_tokens} new tokens exceed block "
                             f"size {self.config.block_size}")
        cache = self.new_cache() if use_cache else None
        out = idx
        for i in range(max_new_tokens):
            if cache is None:
                logits = self.recompute_step(out)
            elif i == 0:
                logits = self.prefill(out, cache)
            else:
                logits = self.decode_step(out[:, -1:], cache)
            nxt = sample_next(logits, top_k=top_k, temperature=temperature,
                              generator=generator)
            out = torch.cat((out, nxt), dim=1)
        return out


@dataclass
class KVCache:
    """Every layer's keys and values so far, each (B, nh, length, hs).

    Grown, not preallocated: each step appends with torch.cat, so the cache tensors hold exactly
    the positions written, and their bytes rise by one position per decode step, the line the
    tutorial's §5.2 draws and memtop measures against 2 × layers × B × T × dim × bytes. The price
    is a copy of each layer's cache per token (old and new side by side for a moment; aten::cat
    in the decode profile). A server preallocates to the longest context instead (no copies,
    memory claimed at admission); see docs/INFERENCE.md for that trade.
    """

    n_layer: int
    k: list[torch.Tensor | None] = field(default_factory=list)
    v: list[torch.Tensor | None] = field(default_factory=list)
    length: int = 0  # positions cached (same in every layer between steps)

    def __post_init__(self) -> None:
        self.k = [None] * self.n_layer
        self.v = [None] * self.n_layer

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) \
            -> tuple[torch.Tensor, torch.Tensor]:
        old_k, old_v = self.k[layer], self.v[layer]
        if old_k is not None and old_v is not None:
            k = torch.cat((old_k, k), dim=2)
            v = torch.cat((old_v, v), dim=2)
        else:  # own storage: k and v are views into the (B, T, 3C) q/k/v projection
            k, v = k.contiguous(), v.contiguous()
        self.k[layer], self.v[layer] = k, v
        return k, v

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (*self.k, *self.v) if t is not None]

    def nbytes(self) -> int:
        """Bytes of the storages the cache holds (measured from the tensors, each counted once)."""
        seen: dict[int, int] = {}
        for t in self.tensors():
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        return sum(seen.values())


def sample_next(logits: torch.Tensor, *, top_k: int = 0, temperature: float = 1.0,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token per row (B, 1): greedy when ``top_k`` is 0, else top-k sampling from
    ``generator`` (seeded by the caller, so a run repeats)."""
    if top_k <= 0:
        return torch.argmax(logits, dim=-1, keepdim=True)
    logits = logits.float() / max(temperature, 1e-6)
    values, indices = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1)  # (B, k)
    probs = F.softmax(values, dim=-1)
    choice = torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)
    return torch.gather(indices, -1, choice)
