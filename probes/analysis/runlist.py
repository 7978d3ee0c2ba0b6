"""One line per run folder, for `memtop runs`: what state each run is in and what it reached.

A run without run_finished is either still going (its socket answers a ping) or interrupted
(killed, or its machine went down): the ping tells them apart without trusting a pid, which may
belong to another process by now or to another host.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

from probes.control.unix_socket import NotLive
from probes.control.unix_socket import request as send_request
from probes.records import StepSample, record_from_json
from probes.runfolder import CONFIG, metrics_files, read_history, socket_name
from probes.runfolder.state import RunState


@dataclass(frozen=True)
class RunSummary:
    run_dir: Path
    outcome: str  # live | finished | stopped | interrupted | failed | empty
    steps: int
    ranks: int
    device: str | None
    amp: str | None
    started_at: float | None  # seconds since the epoch (config.json's mtime)
    throughput: float | None  # the last step's tokens/s (else samples/s, else steps/s), summed
    # over ranks when several wrote the run
    throughput_unit: str  # "tok/s", "samples/s" or "steps/s"
    peak_bytes: int | None  # the last step's peak counter (allocated on CUDA, heap on CPU);
    # the highest rank's when several wrote the run
    reason: str | None  # why it stopped or failed


def _throughput(s: StepSample) -> tuple[float | None, str]:
    if s.tokens_per_s is not None:
        return s.tokens_per_s, "tok/s"
    if s.samples_per_s is not None:
        return s.samples_per_s, "samples/s"
    return (1000.0 / s.step_ms if s.step_ms else None), "steps/s"


def _live(run_dir: Path, rank: int | None) -> bool:
    try:
        answer = send_request(run_dir / socket_name(rank), {"request": "ping"}, timeout_s=0.5)
    except NotLive:
        return False
    return bool(answer.get("ok"))


def summarize_run(run_dir: Path, ping: bool = True) -> RunSummary:
    """The run's state folded from its first rank's events and last step (fast on long runs)."""
    run_dir = Path(run_dir)
    files = metrics_files(run_dir)
    state = RunState()
    rank = next(iter(files), None)
    if files:
        with contextlib.suppress(OSError, ValueError):
            hist = read_history(files[rank], keep_last=1, chart_points=1)
            for row in hist.rows:
                with contextlib.suppress(ValueError):
                    state.apply(record_from_json(row))
    started = None
    with contextlib.suppress(OSError):
        started = (run_dir / CONFIG).stat().st_mtime
    outcome = state.outcome if state.records else "empty"
    if outcome in ("live", "empty") and not state.finished:
        if ping and _live(run_dir, rank):
            outcome = "live"
        elif outcome == "live":
            outcome = "interrupted"  # no run_finished and nobody answers
    last = state.last_sample
    value, unit = _throughput(last) if last is not None else (None, "tok/s")
    reason = state.error or (state.stop_reason if outcome not in ("live", "finished") else None)
    peak = last.peak_allocated_bytes if last is not None else None
    if len(files) > 1:  # several ranks: all ranks' throughput, the highest peak, who failed
        lasts = [_last_sample(path) for path in files.values()]
        if all(s is not None for s in lasts):
            rates = [_throughput(s) for s in lasts if s is not None]
            if all(v is not None for v, _ in rates):
                value = sum(v for v, _ in rates if v is not None)
        peaks = [s.peak_allocated_bytes for s in lasts
                 if s is not None and s.peak_allocated_bytes is not None]
        peak = max(peaks) if peaks else peak
        if outcome != "live":
            from probes.analysis.ranks import failure_text, rank_ends, read_process_exits

            failed = failure_text(rank_ends(run_dir), read_process_exits(run_dir))
            if failed:
                outcome, reason = "failed", failed
    return RunSummary(run_dir, outcome, state.step, max(1, len(files)),
                      state.device or None, state.amp or None, started, value, unit,
                      peak, reason)


def _last_sample(path: Path) -> StepSample | None:
    with contextlib.suppress(OSError, ValueError):
        hist = read_history(path, keep_last=1, chart_points=1)
        for row in reversed(hist.rows):
            if "event" not in row:
                return StepSample.from_json(row)
    return None


def started_text(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t is not None else "n/a"


