"""FLOPs for MFU: the work per token of a model memtop knows (or the loop says), and the
device's dense peak from vendor datasheets. A model or device memtop has no figure for gets
no MFU, never a guess."""

from __future__ import annotations

import re
from typing import Any

from probes.analysis.report.context import is_gpt_config
from probes.records import finite_num, is_int

# Dense peak FLOP/s from vendor datasheets (no sparsity): (model pattern, {compute dtype: FLOP/s}).
# fp32 means plain FP32 (torch leaves TF32 matmuls off by default). A pattern must match the whole
# model token at the start of the name once the vendor words are removed ("A100-SXM4-80GB" ->
# A100; "RTX A1000" is not an A100). H800/A800 are the export variants: same compute.
_END = r"(?=$|[\s-])"
PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    (rf"H[18]00{_END}.*PCIe", {"bf16": 756e12, "fp16": 756e12, "fp32": 51e12}),
    # H100 NVL and H200 NVL share the lower-clocked figures; before the SXM catch-all.
    (rf"H[12]00{_END}.*NVL", {"bf16": 835e12, "fp16": 835e12, "fp32": 60e12}),
    (rf"(H100|H200|H800|GH200){_END}", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
    (rf"A[18]00{_END}", {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}),
    (rf"L40S{_END}", {"bf16": 362e12, "fp16": 362e12, "fp32": 91.6e12}),
    (rf"L4{_END}", {"bf16": 121e12, "fp16": 121e12, "fp32": 30.3e12}),
    (rf"A10{_END}", {"bf16": 125e12, "fp16": 125e12, "fp32": 31.2e12}),
    (r"RTX 4090$", {"bf16": 165e12, "fp16": 165e12, "fp32": 82.6e12}),
    (rf"V100{_END}", {"fp16": 125e12, "fp32": 15.7e12}),
    (rf"T4{_END}", {"fp16": 65e12, "fp32": 8.1e12}),
)
_VENDOR_WORDS = re.compile(r"^(NVIDIA\s+)?(Tesla\s+|GeForce\s+)?", re.IGNORECASE)


def peak_flops(device_name: str | None, amp: str,
               mig: bool | None = None) -> tuple[float | None, str]:
    """(peak FLOP/s, why) for the device and compute dtype; None where memtop has no figure.

    A MIG slice (``mig``, or "MIG" in the name) has only part of the GPU's SMs; memtop keeps no
    per-profile figures, so MFU is not computed rather than divided by the whole GPU's peak."""
    if not device_name or device_name.upper() == "CPU":
        return None, ("memtop keeps no peak FLOP/s for CPUs (it depends on cores, clocks and "
                      "vector units), so it reports achieved FLOP/s, not MFU")
    if mig or re.search(r"\bMIG\b", device_name):
        return None, (f"{device_name} is a MIG slice with a fraction of the GPU's SMs and memtop "
                      "keeps no per-slice peak, so it reports achieved FLOP/s, not MFU")
    dtype = amp if amp in ("bf16", "fp16") else "fp32"
    model = _VENDOR_WORDS.sub("", device_name.strip())
    for pattern, table in PEAK_FLOPS:
        if re.match(pattern, model, re.IGNORECASE):
            if dtype in table:
                return table[dtype], f"{device_name}: {table[dtype] / 1e12:g} TFLOP/s {dtype} dense"
            return None, f"{device_name} has no {dtype} tensor-core figure in memtop's table"
    return None, f"peak FLOP/s of {device_name!r} is not in memtop's table"


def flops_per_token(config: dict[str, Any], params: int | None,
                    given: Any = None) -> dict[str, Any] | None:
    """The loop's own figure (Monitor's flops_per_token) or, for memtop's GPT, nanoGPT's
    estimate 6N + 12·L·D·T, N without the position table (block_size × D). Any other model:
    unknown, never guessed."""
    if finite_num(given) and given > 0:
        return {"flops_per_token": given, "non_embedding_params": None,
                "formula": "given by the training loop (Monitor flops_per_token=)"}
    if not params or not is_gpt_config(config):
        return None
    L, D, T = config["layers"], config["dim"], config["seq_len"]
    block = config.get("block_size") if is_int(config.get("block_size")) else T
    n = params - block * D
    return {"flops_per_token": 6 * n + 12 * L * D * T, "non_embedding_params": n,
            "formula": "6N + 12·L·D·T (nanoGPT estimate_mfu; N excludes the position table)"}
