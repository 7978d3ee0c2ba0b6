"""Every kind of event a run writes, each declared once: its fields with their types (what a
reader may rely on; a value of another type is dropped on reading), whether headless output
prints it, and the one-line summary that headless output and the dashboard show (the longer
summaries and the field shapes several kinds share are in probes/records/event_text.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from probes.records.attribution import ATTRIBUTION_FIELDS, attribution_summary
from probes.records.culprits import LEAK_CULPRIT_FIELDS, culprit_summary
from probes.records.event_text import (
    LEAK_FIELDS,
    OP_FIELDS,
    SOFTWARE,
    admission_text,
    baseline_text,
    control_text,
    error_text,
    evaluate_text,
    fit_point_text,
    guard_text,
    leak_text,
    profile_done_text,
    request_done_text,
    save_text,
    started_text,
    weights_saved_text,
)
from probes.records.forecast import fill_text
from probes.records.infer_attribution import (
    INFER_ATTRIBUTION_FIELDS,
    infer_attribution_summary,
)
from probes.records.step import StepSample
from probes.records.values import clean, finite_num, is_int, short_text
from probes.records.workers import (
    CHILD_FIELDS,
    WORKERS_FIELDS,
    worker_died_summary,
    workers_summary,
)


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
        return cls(name, step if is_int(step) else 0,
                   float(time_s) if finite_num(time_s) is not None else 0.0, data,
                   rank if is_int(rank) else 0)

    @property
    def kind(self) -> EventKind | None:
        return EVENT_KINDS.get(self.event)

    def summary(self) -> str:
        """The kind's one-line sentence for this event (the generic key=value list otherwise);
        "incomplete event (no ...)" when a field its sentence needs is missing."""
        kind = self.kind
        text = incomplete(self.event, self.data)
        if text is not None:
            return text
        if kind is not None and kind.summary is not None:
            try:  # a null reads as missing: the kind's text puts its "?" or leaves it out
                return kind.summary({k: v for k, v in self.data.items() if v is not None})
            except Exception:  # a hand-edited row: fall back to the plain listing
                pass
        return "  ".join(f"{k}={'n/a' if v is None else short_text(v)}"
                         for k, v in self.data.items() if k not in BULKY_FIELDS)


Record = StepSample | Event

# Fields too big for one line of text (they stay in metrics.jsonl and the report).
BULKY_FIELDS = frozenset({"traceback", "top_ops", "system", "lines", "model", "phases",
                          "culprits", "modules", "hints"})


def incomplete(event: str, data: Mapping[str, Any]) -> str | None:
    """"incomplete event (no a, b)" when an event of a declared kind lacks a field its text needs
    (missing, null, or dropped on reading for a wrong type), else None. An event that carries
    its own ``error`` text is complete: the error is what it says. Every place that renders an
    event (summaries, the report's sections) asks this first, so a hand-edited or foreign row
    reads as incomplete, never as "None"."""
    kind = EVENT_KINDS.get(event)
    if kind is None or (isinstance(data.get("error"), str) and data["error"]):
        return None
    missing = [name for name in kind.required if data.get(name) is None]
    return f"incomplete event (no {', '.join(missing)})" if missing else None


def record_from_json(row: Mapping[str, Any]) -> Record:
    """Any metrics.jsonl row back into its record; ValueError for a row that is neither."""
    if "event" in row:
        return Event.from_json(row)
    return StepSample.from_json(row)



# ---- the event kinds ---------------------------------------------------------------------------
@dataclass(frozen=True)
class EventKind:
    name: str
    doc: str  # what it means, for docs/ARCHITECTURE.md and the help
    fields: Mapping[str, Any] = field(default_factory=dict)  # what readers may rely on
    loud: bool = True  # headless output prints a line for it
    summary: Callable[[Mapping[str, Any]], str] | None = None  # the line's text
    required: tuple[str, ...] = ()  # fields the text needs: without one it is incomplete


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
LEAK_FORECAST = "leak_forecast"
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
WEIGHTS_SAVED = "weights_saved"
REQUEST_DONE = "request_done"
ADMISSION = "admission"
CACHE_BASELINE = "cache_baseline"
EVALUATE = "evaluate"
SAVE = "save"
LEAK_CULPRIT = "leak_culprit"
LEAK_LOOK = "leak_look"
ATTRIBUTION_STARTED = "attribution_started"
MEMORY_ATTRIBUTION = "memory_attribution"
ATTRIBUTION_CANCELLED = "attribution_cancelled"
INFER_ATTRIBUTION = "infer_attribution"
WORKERS = "workers"
WORKER_DIED = "worker_died"
FIT_POINT = "fit_point"

_KINDS = (
    EventKind(RUN_STARTED, "the run's device, amp, model size, counters and machine",
              {"device": "str", "device_name": "str", "device_total_bytes": "int", "amp": "str",
               "params": "int", "counters": "str", "driver_counter": "str", "world_size": "int",
               "pid": "int", "host": "str", "metrics_url": "str", "tokens_per_step": "int",
               "samples_per_step": "int", "flops_per_token": "num", "step_clock": "str",
               "memory_history": "str", "nvml_match": "str", "mig": "bool",
               "workers_counter": "str",
               "mode": "str", "weights": "str", "kv_formula": "str",
               "kv_bytes_per_token": "int",
               "switches": {"eval": "bool", "inference_mode": "bool", "grad_scaler": "str"},
               "system": {"gpu_name": "str", "gpu_uuid": "str", "gpu_capability": "scalar",
                          "cpu_model": "str",
                          "cpu_count": "int", "ram_bytes": "int",
                          **{k: "scalar" for k in SOFTWARE}}},
              summary=started_text),
    EventKind(RUN_FINISHED, "the last row of every run: why it ended",
              {"reason": "str", "state": "str", "abandoned_step": "int",
               "mid_step_heap_reads": "int", "mid_step_heap_reads_skipped": "int"},
              summary=lambda d: str(d.get("reason")),
              required=("reason",)),
    EventKind(ERROR, "the training failed: type, message, traceback, CUDA artifacts",
              {"error_type": "str", "message": "str", "traceback": "str"}, summary=error_text,
              required=("error_type", "message")),
    EventKind(PAUSED, "training paused at a step boundary", {"source": "str"},
              summary=lambda d: f"by {d.get('source', '?')}"),
    EventKind(RESUMED, "training resumed", {"paused_s": "num"},
              summary=lambda d: f"after {d.get('paused_s', 0):.1f} s",
              required=("paused_s",)),
    EventKind(PROFILE_STARTED, "a profiler window opened (its schedule and folder)",
              {"wait": "int", "warmup": "int", "active": "int", "trigger": "str", "dir": "str",
               "record_shapes": "bool", "profile_memory": "bool", "phase": "str"},
              summary=lambda d: f"wait {d.get('wait')} / warmup {d.get('warmup')} / active "
                                f"{d.get('active')} into {d.get('dir')}",
              required=("wait", "warmup", "active", "dir")),
    EventKind(PROFILE_ANALYSING, "the window's trace is written; its table is being computed",
              {"dir": "str", "export_s": "num"}, loud=False),
    EventKind(PROFILE_DONE, "a profiler window's top-ops table is ready",
              {"dir": "str", "sort_by": "str", "analysis_s": "num", "top_ops": [OP_FIELDS],
               "phases": [{"name": "str", "calls": "int", "cpu_total_us": "num",
                           "device_span_us": "num"}],
               "device_time": {"total_us": "num", "launched_us": "num",
                               "unattributed_us": "num", "unattributed_events": "int",
                               "linked_by_external_id": "int", "linked_by_correlation": "int"},
               "phase": "str"},
              summary=profile_done_text,
              required=("dir",)),
    EventKind(PROFILE_CANCELLED, "a profiler window ended without a table, and why",
              {"dir": "str", "reason": "str"}, summary=lambda d: str(d.get("reason")),
              required=("reason",)),
    EventKind(LEAK_SUSPECTED, "sustained growth of end-of-step memory", LEAK_FIELDS,
              summary=leak_text,
              required=("counter", "bytes_per_step", "since_step")),
    EventKind(LEAK_LOOK, "the culprit finder's first look: its steps until leak_culprit are "
              "disturbed (probes/records/disturbed.py)", {"trigger": "str"}, loud=False),
    EventKind(LEAK_CULPRIT, "what grew between two looks and what holds it (the finder)",
              LEAK_CULPRIT_FIELDS, summary=culprit_summary,
              required=("culprits", "steps")),
    EventKind(ATTRIBUTION_STARTED, "a memory attribution window opened: per-module hooks for "
              "its warm-up and measured steps (disturbed: probes/records/disturbed.py)",
              {"warmup": "int", "steps": "int", "trigger": "str", "modules_hooked": "int",
               "request": "int"},
              summary=lambda d: f"{d.get('warmup')} warm-up + {d.get('steps')} measured "
                                f"step(s), {d.get('trigger')}",
              required=("warmup", "steps")),
    EventKind(MEMORY_ATTRIBUTION, "per-module parameters, gradients, optimizer state, saved "
              "activations and forward peaks over a window (docs/ATTRIBUTION.md)",
              ATTRIBUTION_FIELDS, summary=attribution_summary,
              required=("modules", "steps")),
    EventKind(INFER_ATTRIBUTION, "`memtop infer`'s memory window: per module, the KV cache it "
              "keeps and its forward peaks in a prefill and a decode step (docs/ATTRIBUTION.md)",
              INFER_ATTRIBUTION_FIELDS, summary=infer_attribution_summary,
              required=("modules", "request")),
    EventKind(ATTRIBUTION_CANCELLED, "a memory attribution window ended without a table, and "
              "why", {"reason": "str"}, summary=lambda d: str(d.get("reason")),
              required=("reason",)),
    EventKind(LEAK_CLEARED, "the grown counter is flat again", LEAK_FIELDS,
              summary=lambda d: f"{d.get('counter')} flat since step {d.get('since_step')}",
              required=("counter", "since_step")),
    EventKind(LEAK_FORECAST, "an open leak alert's time to full, recomputed every few seconds",
              LEAK_FIELDS, summary=lambda d: f"{d.get('counter')}: {fill_text(d) or 'n/a'}",
              required=("counter",)),
    EventKind(LEAK_DEMO_STARTED, "the leak demo started keeping tensors", LEAK_FIELDS,
              summary=lambda d: f"{d.get('kind')}: {d.get('hint', '')}",
              required=("kind",)),
    EventKind(LEAK_DEMO_STOPPED, "the leak demo stopped and released what it kept",
              LEAK_FIELDS,
              summary=lambda d: f"released {d.get('released_tensors', '?')} tensors",
              required=("released_tensors",)),
    EventKind(LEDGER, "the memory ledger moved (measured lines beside the formulas)",
              {"lines": [{"name": "str", "measured_bytes": "int", "predicted_bytes": "int",
                          "formula": "str", "note": "str"}],
               "model": {"vocab_size": "int", "param_dtype": "str"},
               "sampled_step": "int", "batch_size": "int", "seq_len": "int", "snapshot": "str",
               "measure_ms": "num", "total_measured_bytes": "int", "allocated_bytes": "int",
               "reserved_bytes": "int", "explained_bytes": "int", "unexplained_bytes": "int",
               "tensors_at_snapshot_bytes": "int",
               "unexplained_ratio": "num", "attention_scores_bytes": "int",
               "peak_allocated_bytes": "int", "counter": "str", "device": "str",
               "rest": {"allocated": "int", "reserved": "int", "rss": "int"},
               "budget_bytes": "int", "budget_source": "str", "max_seq_len": "int",
               "world_size": "int", "batch_dim": "int"},
              loud=False,
              required=("sampled_step", "snapshot", "measure_ms")),
    EventKind(LEDGER_FAILED, "the ledger stopped measuring, and why", {"message": "str"},
              summary=lambda d: str(d.get("message")),
              required=("message",)),
    EventKind(MEMORY_GUARD, "--max-memory stopped the run before the limit", LEAK_FIELDS,
              summary=guard_text,
              required=("counter", "watched_bytes", "limit_bytes")),
    EventKind(METRICS_WRITE_FAILED, "metrics.jsonl could not be written (disk full ...)",
              {"reason": "str"}, summary=lambda d: str(d.get("reason")),
              required=("reason",)),
    EventKind(REPORT_WRITTEN, "report.md / report.json were (re)written", {"path": "str"},
              loud=False),
    EventKind(HINT, "a pitfall seen live (tutorial §7): what, why, what to do; once a run",
              {"hint": "str", "title": "str", "why": "str", "detail": "str"},
              summary=lambda d: f"{d.get('title')}: {d.get('detail') or d.get('why')}",
              required=("title",)),
    EventKind(MEMORY_SNAPSHOT, "a CUDA memory snapshot for pytorch.org/memory_viz (the m key)",
              {"path": "str", "dump_s": "num", "bytes": "int", "kind": "str", "error": "str"},
              summary=lambda d: str(d.get("error") or f"{d.get('path')} ({d.get('kind')}, "
                                                        f"{d.get('dump_s')} s)"),
              required=("path", "kind", "dump_s")),
    EventKind(CONTROL, "a request from a viewer or the launcher, accepted",
              {"request": "str", "source": "str", "at_step": "int"}, summary=control_text,
              required=("request",)),
    EventKind(WEIGHTS_SAVED, "the trained weights were written (weights.pt), or why not",
              {"path": "str", "bytes": "int", "error": "str"}, summary=weights_saved_text,
              required=("path", "bytes")),
    EventKind(REQUEST_DONE, "inference: one request (B sequences) generated all its tokens",
              {"request": "int", "ttft_ms": "num", "decode_ms_p50": "num",
               "decode_ms_p95": "num", "prefill_tokens_per_s": "num",
               "decode_tokens_per_s": "num", "kv_cache_bytes": "int",
               "kv_cache_predicted_bytes": "int", "new_tokens": "int"},
              summary=request_done_text,
              required=("request",)),
    EventKind(ADMISSION, "inference: how many concurrent sequences fit in the budget, and why",
              {"budget_bytes": "int", "budget_source": "str", "used_bytes": "int",
               "weights_bytes": "int", "kv_bytes_per_sequence": "int",
               "temp_bytes_per_sequence": "int", "sequences_fit": "int", "seq_len": "int",
               "limit": "str", "limit_kind": "str"}, summary=admission_text,
              required=("sequences_fit", "seq_len", "budget_bytes", "budget_source", "limit")),
    EventKind(CACHE_BASELINE, "inference: the same tokens with and without the KV cache",
              {"tokens": "int", "batch_size": "int", "prompt_len": "int",
               "cached_ms_per_token_p50": "num", "recompute_ms_per_token_p50": "num",
               "cached_total_ms": "num", "recompute_total_ms": "num", "speedup": "num",
               "cached_peak_bytes": "int", "recompute_peak_bytes": "int",
               "kv_cache_bytes": "int", "same_tokens": "bool", "peak_note": "str"},
              summary=baseline_text,
              required=("tokens", "cached_ms_per_token_p50", "recompute_ms_per_token_p50")),
    EventKind(WORKERS, "the training process's children changed: a worker started or ended "
              "(its pid, bytes, how it ended), or a child memtop leaves out (its own analysis, "
              "multiprocessing's helpers); probes/counters/workers.py", WORKERS_FIELDS,
              loud=False, summary=workers_summary),
    EventKind(WORKER_DIED, "a worker ended killed by a signal or with a non-zero exit status",
              CHILD_FIELDS, summary=worker_died_summary, required=("pid", "exit")),
    EventKind(EVALUATE, "a framework's evaluation ran between two optimizer steps (HF, Lightning)",
              {"seconds": "num", "metrics": {}, "source": "str"}, summary=evaluate_text),
    EventKind(FIT_POINT, "memtop fit: one probe point (B, T) measured, its peak split into parts",
              {"batch_size": "int", "seq_len": "int", "status": "str", "reason": "str",
               "peak_bytes": "int", "counter_peak_bytes": "int", "counter_peak_name": "str",
               "scores_bytes": "int", "spread": "num", "steps": "int", "seconds": "num",
               "step_ms": "num", "peak_source": "str", "parts": {}, "rest": {},
               "role": "str"},
              summary=fit_point_text, required=("batch_size", "seq_len", "status")),
    EventKind(SAVE, "a framework saved a checkpoint between two optimizer steps (HF, Lightning)",
              {"seconds": "num", "path": "str", "source": "str"}, summary=save_text),
)
EVENT_KINDS: dict[str, EventKind] = {k.name: k for k in _KINDS}

