"""What a memory attribution window means, in the user's terms: sentences with the window's own
measured figures (docs/ATTRIBUTION.md, "hints"). Pure: the instrument puts them in its
``memory_attribution`` event; the report and the dashboard show them as written.

- which module group keeps most activations, and how it grows with T: the T×T attention scores
  among its saved bytes grow with T², the rest with T (both measured by the window);
- what checkpointing the blocks would free (their saved activations less the inputs a
  checkpoint keeps) and what it would cost (one more forward of those blocks in backward, at
  the undisturbed forward time measured before the window);
- the optimizer state against the parameters, and what an 8-bit optimizer or ZeRO would cut.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from probes.records.attribution import (
    at_depth,
    block_groups,
    choose_depth,
    module_label,
    pattern,
    sort_rows,
)
from probes.tools.units import format_bytes

T_FACTOR = 4  # "at 4× today's T"
SCORES_SHARE = 0.2  # scores above this share of a group's activations: say T²
OPT_RATIO = 1.5  # optimizer state above this × parameters: say what would cut it


def _n(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else 0.0


def growth(linear_bytes: float, scores_bytes: float, factor: float = T_FACTOR) -> float:
    """How many times a group's saved bytes grow when T grows ``factor``×: the scores with
    the square, the rest linearly (B, D, layers fixed)."""
    total = linear_bytes + scores_bytes
    if total <= 0:
        return factor
    return (linear_bytes * factor + scores_bytes * factor * factor) / total


def concentration_hint(data: Mapping[str, Any]) -> str | None:
    """"transformer.h.*.attn keeps 61% of activations (...); ... grows ≈ 9.3× at T=512"."""
    rows = [r for r in data.get("modules") or [] if isinstance(r, dict)]
    total = _n(data.get("activations_total_bytes"))
    if not rows or total <= 0:
        return None
    level = choose_depth(rows)
    groups = block_groups(rows, level) or at_depth(rows, level)
    top = sort_rows(groups, "activations_bytes")[0]
    acts, scores = _n(top.get("activations_bytes")), _n(top.get("scores_bytes"))
    if acts <= 0:
        return None
    text = (f"{module_label(top)} keeps {acts / total:.0%} of activations "
            f"({format_bytes(acts)} of {format_bytes(total)})")
    seq = data.get("seq_len")
    if isinstance(seq, int) and seq > 0:
        bigger = seq * T_FACTOR
        if scores / acts >= SCORES_SHARE:
            grow = growth(acts - scores, scores)
            text += (f"; {scores / acts:.0%} of it is T×T attention scores, so at T={bigger} "
                     f"({T_FACTOR}× today's {seq}) it grows ≈ {grow:.1f}× (scores ∝ T²): "
                     "scaled_dot_product_attention keeps no T×T matrix (memtop: --attention "
                     "sdpa)")
        else:
            text += f"; it grows ∝ T (≈ {T_FACTOR}× at T={bigger})"
    return text


def _block_range(names: list[str]) -> str:
    """transformer.h.0, .1, .2, .3 -> transformer.h.0–3 (or a list when not consecutive)."""
    nums = []
    for name in names:
        m = re.search(r"(\d+)$", name)
        if m is None:
            return ", ".join(names)
        nums.append(int(m.group(1)))
    base = names[0][:len(names[0]) - len(str(nums[0]))]
    nums.sort()
    if nums == list(range(nums[0], nums[-1] + 1)):
        return f"{base}{nums[0]}–{nums[-1]}" if len(nums) > 1 else f"{base}{nums[0]}"
    return base + ",".join(map(str, nums))


def checkpoint_hint(data: Mapping[str, Any]) -> str | None:
    """"checkpointing transformer.h.0–3 would free ≈ X for ≈ one extra forward (≈ Y ms)"."""
    rows = [r for r in data.get("modules") or [] if isinstance(r, dict)]
    if not rows:
        return None
    level = choose_depth(rows)
    blocks = [r for r in at_depth(rows, level)
              if pattern(str(r.get("module", ""))) != str(r.get("module", ""))
              and not r.get("own") and not r.get("checkpointed")]
    if len(blocks) < 2:
        return None
    acts = sum(_n(r.get("activations_bytes")) for r in blocks)
    kept = sum(_n(r.get("input_bytes")) for r in blocks)
    freed = acts - kept
    if freed <= 0:
        return None
    names = sorted((str(r["module"]) for r in blocks),
                   key=lambda n: (pattern(n), int(re.search(r"(\d+)$", n).group(1))
                                  if re.search(r"(\d+)$", n) else 0))
    text = (f"checkpointing {_block_range(names)} would free ≈ {format_bytes(freed)} of "
            f"activations (a checkpoint keeps only their inputs, {format_bytes(kept)})")
    root = next((r for r in rows if r.get("module") == ""), None)
    root_ms = _n(root.get("forward_ms")) if root else 0.0
    share = sum(_n(r.get("forward_ms")) for r in blocks) / root_ms if root_ms > 0 else None
    plain = _n(data.get("plain_forward_ms"))
    if share is not None and 0 < share <= 1.0 and plain > 0:
        text += (f" for ≈ one extra forward of those blocks in backward (≈ {plain * share:.1f} "
                 f"ms a step at today's forward time of {plain:.1f} ms)")
    else:
        text += " for ≈ one extra forward of those blocks in backward"
    return text


def optimizer_hint(data: Mapping[str, Any]) -> str | None:
    """"the optimizer state is 2.0× the parameters (AdamW): ... would cut Z"."""
    params, opt = _n(data.get("params_total_bytes")), _n(data.get("optimizer_total_bytes"))
    if params <= 0 or opt / params < OPT_RATIO:
        return None
    name = str(data.get("optimizer_class") or "the optimizer")
    eight_bit = opt * 0.75  # two fp32 moments -> two 8-bit moments: a quarter is left
    return (f"the optimizer state is {opt / params:.1f}× the parameters "
            f"({format_bytes(opt)}, {name}): an 8-bit optimizer (bitsandbytes AdamW8bit) "
            f"would cut ≈ {format_bytes(eight_bit)}, ZeRO-1 over N ranks keeps 1/N of it "
            f"on each (≈ {format_bytes(opt / 2)} less per rank at N=2)")


def attribution_hints(data: Mapping[str, Any]) -> list[str]:
    """Every hint the window's figures support, in the order the report lists them."""
    out = []
    for build in (concentration_hint, checkpoint_hint, optimizer_hint):
        try:
            text = build(data)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            text = None
        if text:
            out.append(text)
    return out


__all__ = ["attribution_hints", "checkpoint_hint", "concentration_hint", "growth",
           "optimizer_hint"]
