"""The tutorial's pitfalls (its §7) that memtop can see live, each defined once; the
instrument that watches for them is probes/instruments/hints.py."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HintKind:
    """A pitfall from the tutorial (its §7) that memtop can see live; emitted once a run."""

    name: str
    devices: str  # "any", "cuda" or "cpu": where it can appear
    title: str  # what was seen, one line
    why: str  # why it matters and what to do


HINTS: tuple[HintKind, ...] = (
    HintKind("low_precision_params", "any", "parameters are stored in fp16/bf16",
             "model.half() makes every op and the optimizer's update low precision (nan "
             "losses, updates rounded away); keep fp32 parameters and let autocast pick the "
             "dtype per op"),
    HintKind("scale_collapse", "any", "the GradScaler's scale fell below 1",
             "the scale halves on every overflow; below 1 the gradients overflow even "
             "unscaled, so inf/nan comes from the model or the learning rate, not from fp16's "
             "range"),
    HintKind("many_skipped_steps", "any", "over 10% of optimizer steps were skipped",
             "each skipped step (inf/nan gradients under GradScaler) is a step of data "
             "trained on nothing; a few at the start are normal, many are not"),
    HintKind("no_sync_boundary", "cuda", "step time has no sync boundary",
             "no CUDA tensor was handed to step.set() and no step's CUDA events were read (the "
             "step split off, or the device far behind), so nothing waits for the device and "
             "step_ms measures kernel launches, not the work; pass loss= (read once, one "
             "wait) or keep the step split on (its CUDA events time the device)"),
    HintKind("amp_without_tensor_cores", "cuda", "this GPU has no tensor cores for the amp "
             "dtype", "fp16 tensor cores need sm 7.0, bf16 sm 8.0; below that autocast saves "
             "memory but runs no faster than fp32 (bf16 is emulated)"),
    HintKind("cpu_bf16_emulated", "cpu", "bf16 autocast on a CPU without native bf16",
             "without AVX512-BF16 or AMX the CPU converts every bf16 matmul to fp32 and back: "
             "the default model trained ~16× slower than in fp32 on such a CPU "
             "(benchmarks/RESULTS.md). --amp off trains faster; bf16 still halves activations. "
             "--amp auto picks fp32 there; MEMTOP_CPU_BF16=native|emulated overrides the CPU's "
             "flags where they mislead (a VM that hides them), and the header then names it"),
    HintKind("cache_large", "cuda", "reserved ≫ allocated (a large allocator cache)",
             "freed blocks stay cached for reuse; varying shapes leave gaps the next request "
             "cannot use. PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets segments grow "
             "in place; empty_cache() is no fix"),
    HintKind("alloc_retries", "cuda", "cudaMalloc failed and was retried after a cache flush",
             "the allocator is at the edge of device memory: each retry synchronises and "
             "frees the cache (milliseconds); fragmentation or a too large batch. Try "
             "expandable_segments:True or a smaller batch"),
    HintKind("input_bound", "any", "the loop waits on its data (over 20% of each step)",
             "the time between two steps (the loader, host-to-device copies) is time the model "
             "does not train: give the DataLoader workers (num_workers; more of them, or a "
             "larger prefetch_factor, where it has some), pin_memory=True and "
             "copy batches with .to(device, non_blocking=True) so the next batch is ready "
             "when the step ends"),
    HintKind("optimizer_bound", "any", "the optimizer step takes a large share of the step",
             "a per-parameter loop of small kernels (or Python ops on CPU): the foreach "
             "(foreach=True) or fused (fused=True, CUDA) implementations update all "
             "parameters in a few large kernels"),
    HintKind("gpu_idle", "cuda", "the GPU is idle much of a long step",
             "NVML saw a kernel running in under half of the time while steps take long: the "
             "GPU waits on the host (data loading, Python overhead, syncs such as .item()). "
             "The step split shows where the time goes; larger batches, CUDA graphs or "
             "torch.compile cut the launches"),
)
HINT_KINDS: dict[str, HintKind] = {h.name: h for h in HINTS}
