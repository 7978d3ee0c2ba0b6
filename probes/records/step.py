"""A step row: what one optimizer step measured, as a frozen dataclass with units in its field
names. It crosses threads (the training thread to the UI's ring) and files (one JSON object a
line in metrics.jsonl, probes/runfolder/writer.py). Read back, a row must keep the schema's
rules (``step_row_problem``: types, finite numbers, nothing negative but the loss): a row that
breaks them is a bad line that readers count and say, so a hand-edited or corrupted file never
passes a negative byte count or an infinite step time off as a figure.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from probes.records.values import has_type, is_int


@dataclass(frozen=True, slots=True)  # slots: ~360 B of pymalloc, no 1.3 KB dict from malloc
class StepSample:
    """What one optimizer step measured. None means "this probe could not read" (shown n/a)."""

    step: int  # 1-based index of the optimizer step just finished
    time_s: float  # seconds since the run started, at the end of the step
    loss: float | None  # None when the loop did not hand a loss over
    tokens_per_s: float | None  # tokens of this step / its wall time; None when not known
    # the whole step, data to optimizer update: host wall time (CPU), or on CUDA with the step
    # split the device's time from CUDA events (of step split_step; see step_clock)
    step_ms: float
    allocated_bytes: int | None  # CUDA: memory_allocated; CPU: glibc heap in use
    reserved_bytes: int | None  # CUDA: memory_reserved; CPU: bytes malloc holds from the OS
    peak_allocated_bytes: int | None  # since the reset after warmup (CPU: max of sampled values)
    driver_used_bytes: int | None  # CUDA: NVML, this process on the device; CPU: process RSS
    host_rss_bytes: int | None  # resident set size of this process
    scale: float | None  # GradScaler scale; None when no scaler runs
    skipped_steps: int  # optimizer steps skipped so far (inf/nan gradients)
    amp: str  # "off" | "bf16" | "fp16" (autocast seen in the forward pass) | "unknown"
    device: str  # "cpu" | "cuda:0" ...
    grad_norm: float | None = None  # total gradient norm before clipping (unscaled)
    profiling: bool = False  # the profiler traced this step (wait, warmup or active)
    # why memtop's own diagnosis disturbed this step (traced, the window's analysis, the steps
    # settling after it, a culprit look): one of probes/records/disturbed.py's REASONS, None
    # when undisturbed; every figure (timing, peaks, the leak detector) leaves such steps out
    disturbed: str | None = None
    leak_active: bool = False  # a leak demo was injecting during this step
    samples_per_s: float | None = None  # for loops that count samples, not tokens
    micro_batches: int | None = None  # forward passes in this optimizer step (accumulation)
    rank: int = 0  # the process's rank under torchrun; 0 when alone
    # this step's high-water mark; CPU: sampled, at the step's end and at the end of each forward
    # while that read costs ≤ 0.2% of a step, and always on the first 3 steps after a peak reset
    # and every 16th step (probes/counters/memory.py)
    step_peak_allocated_bytes: int | None = None
    alloc_retries: int | None = None  # CUDA: cudaMalloc retried after a cache flush, so far
    ooms: int | None = None  # CUDA: out-of-memory errors the allocator raised, so far
    gpu_util_pct: float | None = None  # CUDA: NVML utilisation, the latest poll (not per step)
    # CUDA, NVML's latest poll like gpu_util_pct (None on CPU, on MIG slices, where refused)
    mem_bw_util_pct: float | None = None  # % of the period device memory was read or written
    power_w: float | None = None  # board power draw
    power_limit_w: float | None = None  # the enforced power limit
    sm_clock_mhz: float | None = None  # SM clock
    temperature_c: float | None = None  # GPU die temperature
    # where the step went (probes/instruments/phases.py): host clocks on CPU, CUDA events
    # (device time) on CUDA; None where a phase was not seen (no hook fired)
    data_wait_ms: float | None = None  # end of the previous step to the start of this one
    forward_ms: float | None = None  # the root model's forward passes, summed (accumulation)
    backward_ms: float | None = None  # backward passes, summed over micro-batches
    optimizer_ms: float | None = None  # optimizer.step() (pre to post hook)
    other_ms: float | None = None  # the step's span less the three above (never below 0)
    split_step: int | None = None  # the step these phases measured: this one, or on CUDA an
    # earlier one whose events were not done when this step ended (read later, never synced)
    # CPU: the earlier step whose heap read allocated/reserved repeat, where this step's read was
    # left out for its cost (a fragmented heap: probes/counters/memory.py); None when the row's
    # heap counters are its own (always on CUDA)
    heap_read_step: int | None = None
    # the training process's children (DataLoader workers and any other; memtop's own analysis
    # child and multiprocessing's helpers left out), the latest reading of the sampler thread
    # (about once a second, probes/counters/workers.py; not per step): how many, and their
    # summed RSS, PSS and USS (private) bytes from /proc/PID/smaps_rollup; None where not read
    workers: int | None = None
    workers_rss_bytes: int | None = None  # shared pages counted once per worker
    workers_pss_bytes: int | None = None  # each shared page split among the processes mapping it
    workers_uss_bytes: int | None = None  # pages only the workers map: what they add
    # inference steps only (`memtop infer`); left out of a training row's JSON
    phase: str | None = None  # one of PHASES: "prefill" (the prompt) or "decode" (one token)
    tokens: int | None = None  # tokens this step read (prefill: B × prompt) or made (decode: B)
    request: int | None = None  # 1-based request (round of B sequences) the step belongs to
    context_tokens: int | None = None  # positions held in the KV cache after the step
    kv_cache_bytes: int | None = None  # measured: bytes of the cache tensors' storages
    kv_cache_predicted_bytes: int | None = None  # 2 × layers × B × T × dim × bytes/element

    def to_json(self) -> dict[str, Any]:
        # every field is a scalar, a str or None: a flat copy (dataclasses.asdict deep-copies
        # each value, ~0.1 ms per step). Issue 28: the values are read in one C call
        # (operator.attrgetter) and a training row, whose inference fields are all None, is
        # zipped with STEP_FIELDS without a per-field Python check.
        values = self.training_values()
        if values is not None:
            return dict(zip(STEP_FIELDS, values, strict=True))
        row = dict(zip(_STEP_FIELDS, _GET_ALL(self), strict=True))
        for name in INFERENCE_FIELDS:
            if row[name] is None:
                del row[name]
        return row

    def training_values(self) -> tuple[Any, ...] | None:
        """The values of STEP_FIELDS in one C call, or None for an inference row: what the
        metrics writer queues for its thread to encode (``dict(zip(STEP_FIELDS, values))`` is
        the row ``to_json`` gives)."""
        if _GET_INFERENCE(self) == _NO_INFERENCE:
            return _GET_TRAINING(self)
        return None

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> StepSample:
        """A metrics.jsonl step row back into a sample; ValueError (naming the field) when it is
        not one or a value breaks the schema's rules (``step_row_problem``). A missing field
        reads as its default (rows of older memtop versions)."""
        problem = step_row_problem(row)
        if problem is not None:
            raise ValueError(problem)
        return cls(**{name: row.get(name, default)
                      for name, (_kind, _optional, default) in _STEP_FIELDS.items()})


# The step path's row (issue 28): a frozen dataclass's __init__ sets each of its ~40 slots with
# object.__setattr__ (~4 µs a row in vitro, ~3x that after a step's torch work has flushed the
# caches). StepDraft is StepSample's unfrozen twin, made from StepSample's own fields (the same
# slots, in the same order, the same defaults): RunSession.step_draft builds the row as a draft
# in ~1 µs and ``freeze_step`` turns it into the StepSample it is, in place (Python allows a
# __class__ change between two classes of one slot layout), frozen from then on.
StepDraft = dataclasses.make_dataclass(
    "StepDraft", [(f.name, f.type, dataclasses.field(default=f.default))
                  for f in dataclasses.fields(StepSample)],
    slots=True, eq=False, repr=False, match_args=False)
assert StepDraft.__slots__ == StepSample.__slots__ and not hasattr(StepSample, "__post_init__")


def freeze_step(draft: Any) -> StepSample:
    """A StepDraft, now a StepSample (the same object): the step path's cheap constructor."""
    draft.__class__ = StepSample
    return draft


def step_row_problem(row: Mapping[str, Any]) -> str | None:
    """Why ``row`` is not a valid step row, or None: every field of StepSample has its declared
    type (null only where the field allows None), every number is finite, and none is negative
    but the loss's (bytes, times, rates, counts, norms, scale and step are never below zero).
    Every reader of a metrics file applies it (probes/runfolder/reader.py): such a row is a bad
    line, counted and said, never a figure. Fields the schema does not name are ignored."""
    if "event" in row or not is_int(row.get("step")):
        return "not a step row"
    for name, value in row.items():
        spec = _CHECKS.get(name)
        if spec is None:
            continue
        kind, optional, signed = spec
        if value is None:
            if optional:
                continue
            return f"{name} is null"
        t = type(value)
        if kind == "num":
            if t is not float and t is not int:
                return f"{name} is {t.__name__}, not a number"
            if not math.isfinite(value):
                return f"{name} is {value}, not finite"
        elif kind == "int":
            if t is not int:
                return f"{name} is {t.__name__}, not int"
        elif not has_type(value, kind):
            return f"{name} is {t.__name__}, not {kind}"
        else:
            continue
        if value < 0 and not signed:
            return f"{name} is {value}, negative"
    return None


SIGNED_FIELDS = frozenset({"loss"})  # a loop's own loss may be below zero; no other field


def _field_specs(cls: type) -> dict[str, tuple[str, bool, Any]]:
    """name -> (type spec, None allowed, default when missing) from the dataclass annotations."""
    kinds = {"int": "int", "float": "num", "str": "str", "bool": "bool"}
    specs: dict[str, tuple[str, bool, Any]] = {}
    for f in dataclasses.fields(cls):
        parts = [p.strip() for p in str(f.type).split("|")]
        optional = "None" in parts
        base = next(p for p in parts if p != "None")
        default = f.default if f.default is not dataclasses.MISSING else (
            None if optional else {"int": 0, "num": math.nan, "str": "", "bool": False}[
                kinds[base]])
        specs[f.name] = (kinds[base], optional, default)
    return specs


INFERENCE_FIELDS = ("phase", "tokens", "request", "context_tokens", "kv_cache_bytes",
                    "kv_cache_predicted_bytes")  # only in inference rows
STEP_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(StepSample)
                                     if f.name not in INFERENCE_FIELDS)  # in every step row
PREFILL = "prefill"  # the prompt in one pass: compute-bound, big temporary attention
DECODE = "decode"  # one new token per sequence over the cache: bandwidth- and launch-bound
PHASES = (PREFILL, DECODE)  # also the record_function labels in profiler traces
SPLIT_FIELDS = ("data_wait_ms", "forward_ms", "backward_ms", "optimizer_ms", "other_ms")
SPLIT_LABELS = {"data_wait_ms": "data wait", "forward_ms": "forward", "backward_ms": "backward",
                "optimizer_ms": "optimizer", "other_ms": "other"}  # the step split's words
WORKER_FIELDS = ("workers", "workers_rss_bytes", "workers_pss_bytes",
                 "workers_uss_bytes")  # the workers sampler's latest reading, recorded per step

# which clock a row's step_ms (and tokens/s) is on: run_started's "step_clock" says what the run
# used (issue 45); on CUDA a row whose events were not done yet (no split_step) is on the host's
STEP_CLOCK_HOST = "host"  # perf_counter around the step's scope
STEP_CLOCK_CUDA = "cuda_events"  # CUDA events at the scope's start and end: the device's time


def step_clock(sample: StepSample, started: Mapping[str, Any]) -> str:
    """The clock of ``sample.step_ms``: STEP_CLOCK_CUDA where the run timed steps with CUDA
    events and this row has a measured step (its split_step), else STEP_CLOCK_HOST (CPU,
    the split off, a run written before issue 45, the first CUDA rows while the device is
    behind)."""
    if started.get("step_clock") == STEP_CLOCK_CUDA and sample.split_step is not None:
        return STEP_CLOCK_CUDA
    return STEP_CLOCK_HOST


GPU_BUSY_FIELDS = ("gpu_util_pct", "mem_bw_util_pct", "power_w", "power_limit_w",
                   "sm_clock_mhz", "temperature_c")  # NVML's latest poll, recorded per step
_STEP_FIELDS = _field_specs(StepSample)
# name -> (kind, None allowed, may be negative): step_row_problem's rules, from the same specs
_CHECKS = {name: (kind, optional, name in SIGNED_FIELDS)
           for name, (kind, optional, _default) in _STEP_FIELDS.items()}
# StepSample.to_json's readers (issue 28): all values of a row in one C call each
_GET_ALL = operator.attrgetter(*_STEP_FIELDS)
_GET_TRAINING = operator.attrgetter(*STEP_FIELDS)
_GET_INFERENCE = operator.attrgetter(*INFERENCE_FIELDS)
_NO_INFERENCE = (None,) * len(INFERENCE_FIELDS)
