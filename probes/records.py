"""The records a run writes, one definition each: step samples, and every kind of event.

Records cross threads as frozen dataclasses with units in their field names, are written one
JSON object a line to metrics.jsonl (probes/runfolder.py), and are read back with ``from_json``
by the viewer, the report and the comparisons. Each event kind is declared once in
``EVENT_KINDS``: its fields with their types (what a reader may rely on; a value of another type
is dropped on reading, so a hand-edited file shows n/a instead of crashing a reader), whether
headless output prints it, and the short sentence that headless output and the dashboard show.
docs/ARCHITECTURE.md lists them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from probes.units import format_bytes


@dataclass(frozen=True)
class StepSample:
    """What one optimizer step measured. None means "this probe could not read" (shown n/a)."""

    step: int  # 1-based index of the optimizer step just finished
    time_s: float  # seconds since the run started, at the end of the step
    loss: float | None  # None when the loop did not hand a loss over
    tokens_per_s: float | None  # tokens of this step / its wall time; None when not known
    step_ms: float  # wall time of the whole step, data to optimizer update
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
    profiling: bool = False  # the profiler traced this step (wait, warmup or active); not the
    # steps while the window's table is analysed afterwards (a child process does that)
    leak_active: bool = False  # a leak demo was injecting during this step
    samples_per_s: float | None = None  # for loops that count samples, not tokens
    micro_batches: int | None = None  # forward passes in this optimizer step (accumulation)
    rank: int = 0  # the process's rank under torchrun; 0 when alone
    step_peak_allocated_bytes: int | None = None  # this step's high-water mark (CPU: sampled)
    alloc_retries: int | None = None  # CUDA: cudaMalloc retried after a cache flush, so far
    ooms: int | None = None  # CUDA: out-of-memory errors the allocator raised, so far
    # inference steps only (`memtop infer`); left out of a training row's JSON
    phase: str | None = None  # one of PHASES: "prefill" (the prompt) or "decode" (one token)
    tokens: int | None = None  # tokens this step read (prefill: B × prompt) or made (decode: B)
    request: int | None = None  # 1-based request (round of B sequences) the step belongs to
    context_tokens: int | None = None  # positions held in the KV cache after the step
    kv_cache_bytes: int | None = None  # measured: bytes of the cache tensors' storages
    kv_cache_predicted_bytes: int | None = None  # 2 × layers × B × T × dim × bytes/element

    def to_json(self) -> dict[str, Any]:
        # every field is a scalar, a str or None: a flat copy (dataclasses.asdict deep-copies
        # each value, ~0.1 ms per step, a third of the Monitor's own per-step time)
        row = {name: getattr(self, name) for name in _STEP_FIELDS}
        for name in INFERENCE_FIELDS:
            if row[name] is None:
                del row[name]
        return row

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> StepSample:
        """A metrics.jsonl step row back into a sample; ValueError when it is not one.

        Values of the wrong type read as None (or the field's default), so one bad value never
        hides the rest of the row.
        """
        if "event" in row or not _is_int(row.get("step")):
            raise ValueError("not a step row")
        values: dict[str, Any] = {}
        for name, (kind, optional, default) in _STEP_FIELDS.items():
            value = row.get(name, default)
            if not _has_type(value, kind):
                value = None if optional else default
            values[name] = value
        return cls(**values)


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
_STEP_FIELDS = _field_specs(StepSample)


@dataclass(frozen=True)
class Event:
    """Something that happened once: run_started, leak_suspected, profile_done, error, ..."""

    event: str  # one of EVENT_KINDS (readers keep unknown kinds as they are)
    step: int
    time_s: float
    data: dict[str, Any] = field(default_factory=dict)
    rank: int = 0

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"event": self.event, "step": self.step, "time_s": self.time_s}
        if self.rank:
            row["rank"] = self.rank
        row.update(self.data)
        return row

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> Event:
        """An event row back into an Event, its fields checked against its kind's declaration."""
        name = row.get("event")
        if not isinstance(name, str):
            raise ValueError("not an event row")
        spec = EVENT_KINDS[name].fields if name in EVENT_KINDS else {}
        data = clean(row, spec)
        step = data.pop("step", 0)
        time_s = data.pop("time_s", 0.0)
        rank = data.pop("rank", 0)
        data.pop("event", None)
        return cls(name, step if _is_int(step) else 0,
                   float(time_s) if finite_num(time_s) is not None else 0.0, data,
                   rank if _is_int(rank) else 0)

    @property
    def kind(self) -> EventKind | None:
        return EVENT_KINDS.get(self.event)

    def summary(self) -> str:
        """The kind's one-line sentence for this event (the generic key=value list otherwise)."""
        kind = self.kind
        if kind is not None and kind.summary is not None:
            try:
                return kind.summary(self.data)
            except Exception:  # a hand-edited row: fall back to the plain listing
                pass
        return "  ".join(f"{k}={_short(v)}" for k, v in self.data.items()
                         if k not in BULKY_FIELDS)


Record = StepSample | Event

# Fields too big for one line of text (they stay in metrics.jsonl and the report).
BULKY_FIELDS = frozenset({"traceback", "top_ops", "system", "lines", "model", "phases"})


def record_from_json(row: Mapping[str, Any]) -> Record:
    """Any metrics.jsonl row back into its record; ValueError for a row that is neither."""
    if "event" in row:
        return Event.from_json(row)
    return StepSample.from_json(row)


# ---- checking values read back -----------------------------------------------------------------
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def finite_num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _has_type(value: Any, kind: Any) -> bool:
    if value is None:
        return True  # n/a is always allowed
    if isinstance(kind, dict):
        return isinstance(value, dict)
    if isinstance(kind, list):
        return isinstance(value, list)
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return _is_int(value)
    if kind == "num":
        return finite_num(value) is not None
    if kind == "bool":
        return isinstance(value, bool)
    return isinstance(value, (str, int, float))  # "scalar": shown as text


def clean(data: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with every field named in ``spec`` of its declared type; others dropped.

    A dict spec means "a dict, cleaned with this spec"; a one-dict list, "a list of such dicts".
    Fields the spec does not name are kept as recorded.
    """
    out: dict[str, Any] = {}
    for key, value in data.items():
        kind = {"step": "int", "time_s": "num", "rank": "int"}.get(key, spec.get(key))
        if kind is None or value is None:
            out[key] = value
        elif not _has_type(value, kind):
            continue
        elif isinstance(kind, dict):
            out[key] = clean(value, kind)
        elif isinstance(kind, list):
            out[key] = [clean(x, kind[0]) for x in value if isinstance(x, dict)]
        else:
            out[key] = value
    return out


def _short(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


# ---- the event kinds ---------------------------------------------------------------------------
@dataclass(frozen=True)
class EventKind:
    name: str
    doc: str  # what it means, for docs/ARCHITECTURE.md and the help
    fields: Mapping[str, Any] = field(default_factory=dict)  # what readers may rely on
    loud: bool = True  # headless output prints a line for it
    summary: Callable[[Mapping[str, Any]], str] | None = None  # the line's text


RUN_STARTED = "run_started"
RUN_FINISHED = "run_finished"
ERROR = "error"
PAUSED = "paused"
RESUMED = "resumed"
PROFILE_STARTED = "profile_started"
PROFILE_ANALYSING = "profile_analysing"
PROFILE_DONE = "profile_done"
PROFILE_CANCELLED = "profile_cancelled"
LEAK_SUSPECTED = "leak_suspected"
LEAK_CLEARED = "leak_cleared"
LEAK_DEMO_STARTED = "leak_demo_started"
LEAK_DEMO_STOPPED = "leak_demo_stopped"
LEDGER = "ledger"
LEDGER_FAILED = "ledger_failed"
MEMORY_GUARD = "memory_guard"
METRICS_WRITE_FAILED = "metrics_write_failed"
REPORT_WRITTEN = "report_written"
CONTROL = "control"
HINT = "hint"
MEMORY_SNAPSHOT = "memory_snapshot"


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
             "no CUDA tensor was handed to step.set(), so nothing waits for the device and "
             "step_ms measures kernel launches, not the work; pass loss= (read once, one sync)"),
    HintKind("amp_without_tensor_cores", "cuda", "this GPU has no tensor cores for the amp "
             "dtype", "fp16 tensor cores need sm 7.0, bf16 sm 8.0; below that autocast saves "
             "memory but runs no faster than fp32 (bf16 is emulated)"),
    HintKind("cpu_bf16_emulated", "cpu", "bf16 autocast on a CPU without native bf16",
             "without AVX512-BF16 or AMX the CPU converts every bf16 matmul to fp32 and back: "
             "the default model trained ~16× slower than in fp32 on such a CPU "
             "(benchmarks/RESULTS.md). --amp off trains faster; bf16 still halves activations"),
    HintKind("cache_large", "cuda", "reserved ≫ allocated (a large allocator cache)",
             "freed blocks stay cached for reuse; varying shapes leave gaps the next request "
             "cannot use. PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets segments grow "
             "in place; empty_cache() is no fix"),
    HintKind("alloc_retries", "cuda", "cudaMalloc failed and was retried after a cache flush",
             "the allocator is at the edge of device memory: each retry synchronises and "
             "frees the cache (milliseconds); fragmentation or a too large batch. Try "
             "expandable_segments:True or a smaller batch"),
)
HINT_KINDS: dict[str, HintKind] = {h.name: h for h in HINTS}
WEIGHTS_SAVED = "weights_saved"
REQUEST_DONE = "request_done"
ADMISSION = "admission"
CACHE_BASELINE = "cache_baseline"

_OP_FIELDS = {"name": "str", "calls": "int", "self_cpu_us": "num", "cpu_total_us": "num",
              "self_device_us": "num", "device_total_us": "num", "cpu_memory_bytes": "int",
              "device_memory_bytes": "int", "user_annotation": "bool", "on_device": "bool"}
_SOFTWARE = ("python", "torch", "cuda", "cudnn", "numpy", "memtop", "os", "source")
_LEAK_FIELDS: dict[str, Any] = {
    "counter": "str", "kind": "str", "bytes_per_step": "num", "growth_bytes_per_step": "num",
    "since_step": "int", "seconds_to_full": "num", "steps_to_full": "num",
    "capacity_bytes": "int", "hint": "str", "likely_cause": "str", "alert_step": "int",
    "released_tensors": "int", "watched_bytes": "int", "limit_bytes": "int"}


def _started(d: Mapping[str, Any]) -> str:
    name = d.get("device_name") or d.get("device") or "?"
    total = d.get("device_total_bytes")
    text = (f"{name}{' ' + format_bytes(total) if total else ''}, amp {d.get('amp', '?')}, "
            f"{d.get('params', '?')} params")
    if d.get("mode") == "infer":
        text += f", inference: {switches_text(d.get('switches'))}, weights {d.get('weights')}"
    return text


def switches_text(switches: Any, short: bool = False) -> str:
    """The tutorial's three inference switches (§2.4) as the run set them."""
    if not isinstance(switches, Mapping):
        return "n/a"
    scaler = switches.get("grad_scaler")
    if short:
        return "·".join(("eval" if switches.get("eval") else "TRAIN-MODE",
                         "inference_mode" if switches.get("inference_mode") else "GRAD",
                         "no scaler" if not scaler else "SCALER"))
    return (f"eval() {'on' if switches.get('eval') else 'OFF'}, inference_mode "
            f"{'on' if switches.get('inference_mode') else 'OFF'}, "
            f"{'no GradScaler' if not scaler else 'GradScaler ' + str(scaler)}")


def _weights_saved(d: Mapping[str, Any]) -> str:
    if d.get("error"):
        return f"weights not saved: {d['error']}"
    return f"{d.get('path')} ({format_bytes(d.get('bytes'))})"


def _request_done(d: Mapping[str, Any]) -> str:
    def ms(key: str) -> str:
        v = d.get(key)
        return f"{v:.1f} ms" if isinstance(v, (int, float)) else "n/a"

    return (f"request {d.get('request')}: TTFT {ms('ttft_ms')}, decode p50 {ms('decode_ms_p50')} "
            f"p95 {ms('decode_ms_p95')}/token, KV {format_bytes(d.get('kv_cache_bytes'))}")


def _admission(d: Mapping[str, Any]) -> str:
    return (f"{d.get('sequences_fit')} sequences of {d.get('seq_len')} tokens fit in "
            f"{format_bytes(d.get('budget_bytes'))} ({d.get('budget_source')}); limited by "
            f"{d.get('limit')}")


def _baseline(d: Mapping[str, Any]) -> str:
    speed = d.get("speedup")
    return (f"{d.get('tokens')} tokens: cache {d.get('cached_ms_per_token_p50', 0):.2f} ms/token "
            f"vs recompute {d.get('recompute_ms_per_token_p50', 0):.2f} ms/token"
            + (f" ({speed:.1f}x)" if isinstance(speed, (int, float)) else "")
            + ("" if d.get("same_tokens") else "; TOKENS DIFFER"))


def _leak(d: Mapping[str, Any]) -> str:
    rate = format_bytes(d.get("bytes_per_step"))
    text = f"{d.get('counter')} grows {rate}/step since step {d.get('since_step')}"
    if d.get("hint"):
        text += f"; {d['hint']}"
    return text


def _profile_done(d: Mapping[str, Any]) -> str:
    ops = d.get("top_ops") or []
    top = ops[0].get("name") if ops and isinstance(ops[0], dict) else None
    return (f"{d.get('dir')}: {len(ops)} ops, top {top}" if top else f"{d.get('dir')}")


def _error(d: Mapping[str, Any]) -> str:
    return f"{d.get('error_type', 'Error')}: {d.get('message', '')}"


def _control(d: Mapping[str, Any]) -> str:
    at = f" at step {d['at_step']}" if d.get("at_step") else ""
    return f"{d.get('request')} requested by {d.get('source', '?')}{at}"


_KINDS = (
    EventKind(RUN_STARTED, "the run's device, amp, model size, counters and machine",
              {"device": "str", "device_name": "str", "device_total_bytes": "int", "amp": "str",
               "params": "int", "counters": "str", "driver_counter": "str", "world_size": "int",
               "pid": "int", "tokens_per_step": "int", "samples_per_step": "int",
               "memory_history": "str", "nvml_match": "str", "mig": "bool",
               "mode": "str", "weights": "str", "kv_formula": "str",
               "kv_bytes_per_token": "int",
               "switches": {"eval": "bool", "inference_mode": "bool", "grad_scaler": "str"},
               "system": {"gpu_name": "str", "gpu_capability": "scalar", "cpu_model": "str",
                          "cpu_count": "int", "ram_bytes": "int",
                          **{k: "scalar" for k in _SOFTWARE}}},
              summary=_started),
    EventKind(RUN_FINISHED, "the last row of every run: why it ended",
              {"reason": "str", "state": "str", "abandoned_step": "int"},
              summary=lambda d: str(d.get("reason"))),
    EventKind(ERROR, "the training failed: type, message, traceback, CUDA artifacts",
              {"error_type": "str", "message": "str", "traceback": "str"}, summary=_error),
    EventKind(PAUSED, "training paused at a step boundary", {"source": "str"},
              summary=lambda d: f"by {d.get('source', '?')}"),
    EventKind(RESUMED, "training resumed", {"paused_s": "num"},
              summary=lambda d: f"after {d.get('paused_s', 0):.1f} s"),
    EventKind(PROFILE_STARTED, "a profiler window opened (its schedule and folder)",
              {"wait": "int", "warmup": "int", "active": "int", "trigger": "str", "dir": "str",
               "record_shapes": "bool", "profile_memory": "bool", "phase": "str"},
              summary=lambda d: f"wait {d.get('wait')} / warmup {d.get('warmup')} / active "
                                f"{d.get('active')} into {d.get('dir')}"),
    EventKind(PROFILE_ANALYSING, "the window's trace is written; its table is being computed",
              {"dir": "str", "export_s": "num"}, loud=False),
    EventKind(PROFILE_DONE, "a profiler window's top-ops table is ready",
              {"dir": "str", "sort_by": "str", "analysis_s": "num", "top_ops": [_OP_FIELDS],
               "phases": [{"name": "str", "calls": "int", "cpu_total_us": "num",
                           "device_span_us": "num"}],
               "phase": "str"},
              summary=_profile_done),
    EventKind(PROFILE_CANCELLED, "a profiler window ended without a table, and why",
              {"dir": "str", "reason": "str"}, summary=lambda d: str(d.get("reason"))),
    EventKind(LEAK_SUSPECTED, "sustained growth of end-of-step memory", _LEAK_FIELDS,
              summary=_leak),
    EventKind(LEAK_CLEARED, "the grown counter is flat again", _LEAK_FIELDS,
              summary=lambda d: f"{d.get('counter')} flat since step {d.get('since_step')}"),
    EventKind(LEAK_DEMO_STARTED, "the leak demo started keeping tensors", _LEAK_FIELDS,
              summary=lambda d: f"{d.get('kind')}: {d.get('hint', '')}"),
    EventKind(LEAK_DEMO_STOPPED, "the leak demo stopped and released what it kept",
              _LEAK_FIELDS,
              summary=lambda d: f"released {d.get('released_tensors', '?')} tensors"),
    EventKind(LEDGER, "the memory ledger moved (measured lines beside the formulas)",
              {"lines": [{"name": "str", "measured_bytes": "int", "predicted_bytes": "int",
                          "formula": "str", "note": "str"}],
               "model": {"vocab_size": "int", "param_dtype": "str"},
               "sampled_step": "int", "batch_size": "int", "seq_len": "int", "snapshot": "str",
               "measure_ms": "num", "total_measured_bytes": "int", "allocated_bytes": "int",
               "reserved_bytes": "int", "explained_bytes": "int", "unexplained_bytes": "int",
               "unexplained_ratio": "num", "attention_scores_bytes": "int",
               "peak_allocated_bytes": "int", "counter": "str", "device": "str"},
              loud=False),
    EventKind(LEDGER_FAILED, "the ledger stopped measuring, and why", {"message": "str"},
              summary=lambda d: str(d.get("message"))),
    EventKind(MEMORY_GUARD, "--max-memory stopped the run before the limit", _LEAK_FIELDS,
              summary=lambda d: f"{d.get('counter')} at {format_bytes(d.get('watched_bytes'))} "
                                f"would pass {format_bytes(d.get('limit_bytes'))}"),
    EventKind(METRICS_WRITE_FAILED, "metrics.jsonl could not be written (disk full ...)",
              {"reason": "str"}, summary=lambda d: str(d.get("reason"))),
    EventKind(REPORT_WRITTEN, "report.md / report.json were (re)written", {"path": "str"},
              loud=False),
    EventKind(HINT, "a pitfall seen live (tutorial §7): what, why, what to do; once a run",
              {"hint": "str", "title": "str", "why": "str", "detail": "str"},
              summary=lambda d: f"{d.get('title')}: {d.get('detail') or d.get('why')}"),
    EventKind(MEMORY_SNAPSHOT, "a CUDA memory snapshot for pytorch.org/memory_viz (the m key)",
              {"path": "str", "dump_s": "num", "bytes": "int", "kind": "str", "error": "str"},
              summary=lambda d: str(d.get("error") or f"{d.get('path')} ({d.get('kind')}, "
                                                        f"{d.get('dump_s')} s)")),
    EventKind(CONTROL, "a request from a viewer or the launcher, accepted",
              {"request": "str", "source": "str", "at_step": "int"}, summary=_control),
    EventKind(WEIGHTS_SAVED, "the trained weights were written (weights.pt), or why not",
              {"path": "str", "bytes": "int", "error": "str"}, summary=_weights_saved),
    EventKind(REQUEST_DONE, "inference: one request (B sequences) generated all its tokens",
              {"request": "int", "ttft_ms": "num", "decode_ms_p50": "num",
               "decode_ms_p95": "num", "prefill_tokens_per_s": "num",
               "decode_tokens_per_s": "num", "kv_cache_bytes": "int",
               "kv_cache_predicted_bytes": "int", "new_tokens": "int"},
              summary=_request_done),
    EventKind(ADMISSION, "inference: how many concurrent sequences fit in the budget, and why",
              {"budget_bytes": "int", "budget_source": "str", "used_bytes": "int",
               "weights_bytes": "int", "kv_bytes_per_sequence": "int",
               "temp_bytes_per_sequence": "int", "sequences_fit": "int", "seq_len": "int",
               "limit": "str", "limit_kind": "str"}, summary=_admission),
    EventKind(CACHE_BASELINE, "inference: the same tokens with and without the KV cache",
              {"tokens": "int", "batch_size": "int", "prompt_len": "int",
               "cached_ms_per_token_p50": "num", "recompute_ms_per_token_p50": "num",
               "cached_total_ms": "num", "recompute_total_ms": "num", "speedup": "num",
               "cached_peak_bytes": "int", "recompute_peak_bytes": "int",
               "kv_cache_bytes": "int", "same_tokens": "bool", "peak_note": "str"},
              summary=_baseline),
)
EVENT_KINDS: dict[str, EventKind] = {k.name: k for k in _KINDS}

