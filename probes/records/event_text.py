"""How each event kind reads in one line (headless output, toasts, the report) and the field
shapes several kinds share: the text half of probes/records/events.py, whose table names
these summaries beside each kind's fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from probes.records.forecast import fill_text
from probes.records.phase_ops import split_ranges
from probes.records.values import finite_num
from probes.records.windows import window_name, window_steps
from probes.records.workers import WORKERS_COUNTER, workers_leak_text
from probes.tools.units import format_bytes, format_estimate

OP_FIELDS = {"name": "str", "calls": "int", "self_cpu_us": "num", "cpu_total_us": "num",
              "self_device_us": "num", "device_total_us": "num", "cpu_memory_bytes": "int",
              "device_memory_bytes": "int", "user_annotation": "bool", "on_device": "bool"}
SOFTWARE = ("python", "torch", "cuda", "cudnn", "numpy", "memtop", "os", "source")
LEAK_FIELDS: dict[str, Any] = {
    "counter": "str", "kind": "str", "bytes_per_step": "num", "growth_bytes_per_step": "num",
    "since_step": "int", "seconds_to_full": "num", "steps_to_full": "num",
    "capacity_bytes": "int", "hint": "str", "likely_cause": "str", "alert_step": "int",
    "released_tensors": "int", "watched_bytes": "int", "limit_bytes": "int",
    "fill_counter": "str", "limit_name": "str", "fill_bytes_per_step": "num",
    "host_rss_bytes": "int", "alert_rss_bytes": "int",
    # a leak of the DataLoader workers (counter "workers_private"): how many, the trainer's own
    # rate beside theirs, which pattern their growth matches (probes/instruments/leakcause.py)
    "workers": "int", "trainer_bytes_per_step": "num", "trainer_flat": "bool",
    "pattern": "str"}


def started_text(d: Mapping[str, Any]) -> str:
    name = d.get("device_name") or d.get("device") or "?"
    total = d.get("device_total_bytes")
    params = d.get("params")
    text = (f"{name}{' ' + format_bytes(total) if total else ''}, amp {d.get('amp') or '?'}"
            + (f", {params} params" if params is not None else ""))
    if d.get("mode") == "infer":
        text += (f", inference: {switches_text(d.get('switches'))}, weights "
                 f"{d.get('weights') or 'n/a'}")
    if d.get("metrics_url"):
        text += f"; Prometheus: {d['metrics_url']}"
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


def weights_saved_text(d: Mapping[str, Any]) -> str:
    if d.get("error"):
        return f"weights not saved: {d['error']}"
    return f"{d.get('path')} ({format_bytes(d.get('bytes'))})"


def request_done_text(d: Mapping[str, Any]) -> str:
    def ms(key: str) -> str:
        v = d.get(key)
        return f"{v:.1f} ms" if isinstance(v, (int, float)) else "n/a"

    return (f"request {d.get('request')}: TTFT {ms('ttft_ms')}, decode p50 {ms('decode_ms_p50')} "
            f"p95 {ms('decode_ms_p95')}/token, KV {format_bytes(d.get('kv_cache_bytes'))}")


def admission_text(d: Mapping[str, Any]) -> str:
    return (f"{format_estimate(d.get('sequences_fit'))} sequences of {d.get('seq_len')} "
            f"tokens fit in "
            f"{format_bytes(d.get('budget_bytes'))} ({d.get('budget_source')}); limited by "
            f"{d.get('limit')}")


def baseline_text(d: Mapping[str, Any]) -> str:
    speed = d.get("speedup")
    return (f"{d.get('tokens')} tokens: cache {d.get('cached_ms_per_token_p50', 0):.2f} ms/token "
            f"vs recompute {d.get('recompute_ms_per_token_p50', 0):.2f} ms/token"
            + (f" ({speed:.1f}x)" if isinstance(speed, (int, float)) else "")
            + ("" if d.get("same_tokens") else "; TOKENS DIFFER"))


def leak_text(d: Mapping[str, Any]) -> str:
    rate = format_bytes(d.get("bytes_per_step"))
    text = f"{d.get('counter')} grows {rate}/step since step {d.get('since_step')}"
    if d.get("counter") == WORKERS_COUNTER:
        text = f"{workers_leak_text(d)} since step {d.get('since_step')}"
    fill = fill_text(d)
    if fill:
        text += f"; {fill}"
    if d.get("hint"):
        text += f"; {d['hint']}"
    return text


def profile_done_text(d: Mapping[str, Any]) -> str:
    """'steps 52–54 (profiles/step-50): 12 ops, top aten::mm': named by the steps its table
    sums, as every screen names it (probes/records/windows.py)."""
    ops, _ = split_ranges(d.get("top_ops") or [], d.get("phase"))  # an op, not a label
    top = ops[0].get("name") if ops else None
    span = window_steps(d)
    where = f"{window_name(span)} ({d.get('dir')})" if span else f"{d.get('dir')}"
    return f"{where}: {len(ops)} ops, top {top}" if top else where


def guard_text(d: Mapping[str, Any]) -> str:
    """A memory_guard row in one line, with how far from the limit: "host RSS at 580 MiB would
    pass 580 MiB" read as nonsense where 579.5 MiB rounds to the limit (user pass)."""
    watched, limit = finite_num(d.get("watched_bytes")), finite_num(d.get("limit_bytes"))
    text = (f"{d.get('counter')} at {format_bytes(watched)} {guard_verb_text(d)} "
            f"{format_bytes(limit)}")
    if watched is not None and limit is not None and watched != limit:
        text += (f" ({format_bytes(watched - limit)} over)" if watched > limit
                 else f" ({format_bytes(limit - watched)} left)")
    return text


def guard_verb_text(d: Mapping[str, Any]) -> str:
    """'passed' once the watched counter is over the limit, else 'would pass' (issue 44)."""
    watched, limit = finite_num(d.get("watched_bytes")), finite_num(d.get("limit_bytes"))
    over = d.get("passed") is True or (watched is not None and limit is not None
                                       and watched > limit)
    return "passed" if over else "would pass"


def took_text(d: Mapping[str, Any]) -> str:
    seconds = finite_num(d.get("seconds"))
    return f", {seconds:.1f} s" if seconds is not None else ""


def evaluate_text(d: Mapping[str, Any]) -> str:
    metrics = d.get("metrics") if isinstance(d.get("metrics"), Mapping) else {}
    loss = next((v for k, v in metrics.items() if k in ("eval_loss", "val_loss", "loss")
                 and finite_num(v) is not None), None)
    return (f"evaluation between steps{took_text(d)}"
            + (f", loss {loss:.4g}" if loss is not None else ""))


def save_text(d: Mapping[str, Any]) -> str:
    where = f" {d['path']}" if d.get("path") else ""
    return f"checkpoint{where} saved between steps{took_text(d)}"


def error_text(d: Mapping[str, Any]) -> str:
    return f"{d.get('error_type', 'Error')}: {d.get('message', '')}"


def fit_point_text(d: Mapping[str, Any]) -> str:
    where = f"B={d.get('batch_size')} T={d.get('seq_len')}"
    status = d.get("status")
    if status != "ok":
        reason = str(d.get("reason") or "")
        if reason.startswith(str(status)):  # "interrupted (SIGINT)" says its status already
            return f"{where}: {reason}"
        return f"{where}: {status}" + (f" ({reason})" if reason else "")
    spread = finite_num(d.get("spread"))
    return (f"{where}: peak {format_bytes(d.get('peak_bytes'))}"
            + (f" ±{spread:.1%}" if spread else "")
            + f", {d.get('counter_peak_name') or 'counter peak'} "
            f"{format_bytes(d.get('counter_peak_bytes'))}")


def control_text(d: Mapping[str, Any]) -> str:
    at = f" at step {d['at_step']}" if d.get("at_step") else ""
    return f"{d.get('request')} requested by {d.get('source', '?')}{at}"
