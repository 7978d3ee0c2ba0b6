"""One line per run folder, for `memtop runs`: what state each run is in and what it reached.

A run without run_finished is either still going (its socket answers a ping) or interrupted
(killed, or its machine went down): the ping tells them apart without trusting a pid, which may
belong to another process by now or to another host.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

from probes.analysis.measured import throughput_p50
from probes.control.unix_socket import NotLive
from probes.control.unix_socket import request as send_request
from probes.records import StepSample, record_from_json
from probes.runfolder import CONFIG, REPORT_JSON, metrics_files, read_history, socket_name
from probes.runfolder.state import RunState


@dataclass(frozen=True)
class RunSummary:
    run_dir: Path
    outcome: str  # live | paused | finished | incomplete | stopped | interrupted | failed | empty
    steps: int
    ranks: int
    device: str | None
    amp: str | None
    started_at: float | None  # seconds since the epoch (config.json's mtime)
    throughput: float | None  # throughput_p50 (probes/analysis/measured.py): the report's
    # figure, summed over ranks when several wrote the run (a live run: over its last
    # TAIL_STEPS steps)
    throughput_unit: str  # "tok/s", "samples/s" or "steps/s"
    peak_bytes: int | None  # the last step's peak counter (allocated on CUDA, heap on CPU);
    # the highest rank's when several wrote the run
    reason: str | None  # why it stopped or failed


TAIL_STEPS = 512  # a run without a report: its throughput over the last this many steps


def _throughput(path: Path, warmup: int) -> tuple[float | None, str]:
    """One rank's throughput_p50 over the rows read quickly (the last TAIL_STEPS)."""
    with contextlib.suppress(OSError, ValueError):
        hist = read_history(path, keep_last=TAIL_STEPS, chart_points=1)
        return throughput_p50([r for r in hist.rows if "event" not in r], warmup)
    return None, "tok/s"


def _report_throughput(run_dir: Path) -> tuple[float | None, str] | None:
    """The report's own figure (every rank's together for DDP), when report.json has one."""
    try:
        report = json.loads((run_dir / REPORT_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(report, dict) or not report.get("complete", True):
        return None
    together = ((report.get("ranks") or {}).get("global_batch") or {}).get("tokens_per_s") \
        if isinstance(report.get("ranks"), dict) else None
    results = report.get("results") if isinstance(report.get("results"), dict) else {}
    for value, unit in ((together, "tok/s"), (results.get("tokens_per_s_p50"), "tok/s"),
                        (results.get("samples_per_s_p50"), "samples/s")):
        if isinstance(value, (int, float)) and value > 0:
            return float(value), unit
    return None


def _report_gaps(run_dir: Path) -> str | None:
    """Why report.json calls the run incomplete (its reasons joined), None when it is complete
    or has no report: a finished run whose rows have bad lines is not listed "finished"."""
    try:
        report = json.loads((run_dir / REPORT_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(report, dict) or report.get("complete", True) is not False:
        return None
    reasons = report.get("incomplete_reasons")
    if isinstance(reasons, list) and reasons:
        return "; ".join(str(r) for r in reasons)
    return "the report calls the run incomplete"


def socket_answers(run_dir: Path, rank: int | None) -> bool:
    """Whether the run's (rank's) request socket answers a ping: the run is alive."""
    try:
        answer = send_request(run_dir / socket_name(rank), {"request": "ping"}, timeout_s=0.5)
    except NotLive:
        return False
    return bool(answer.get("ok"))


def run_outcome(state: RunState, run_dir: Path, rank: int | None = None,
                ping: bool = True, answered: bool | None = None) -> str:
    """The run's outcome as its rows and its socket tell it: rows without run_finished are a
    live run only while its socket answers a ping ("paused" while it waits for a resume), else
    an interrupted one (killed, or its machine went down); "empty" when there are no rows yet
    and nobody answers. ``answered``: the ping's answer where the caller already has it (the
    metrics exporter pings every few seconds, not at every scrape)."""
    outcome = state.outcome if state.records else "empty"
    if outcome in ("live", "empty") and not state.finished:
        if answered is None:
            answered = ping and socket_answers(run_dir, rank)
        if answered:
            return "paused" if state.state == "paused" else "live"
        if outcome == "live":
            return "interrupted"  # no run_finished and nobody answers
    return outcome


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
    outcome = run_outcome(state, run_dir, rank, ping)
    last = state.last_sample
    warmup = _warmup(run_dir)
    live = outcome in ("live", "paused")
    from_report = _report_throughput(run_dir) if not live else None
    value, unit = from_report or (_throughput(files[rank], warmup) if files else (None, "tok/s"))
    reason = state.error or (state.stop_reason if outcome not in ("live", "paused", "finished")
                             else None)
    gaps = _report_gaps(run_dir) if outcome == "finished" else None
    if gaps:  # the report's own word (sections/header.py): "Incomplete run. 2 bad line(s)"
        outcome, reason = "incomplete", gaps
    peak = last.peak_allocated_bytes if last is not None else None
    if len(files) > 1:  # several ranks: all ranks' throughput, the highest peak, who failed
        lasts = [_last_sample(path) for path in files.values()]
        if from_report is None:
            rates = [_throughput(path, warmup) for path in files.values()]
            value = sum(v for v, _ in rates if v is not None) \
                if all(v is not None for v, _ in rates) else None
        peaks = [s.peak_allocated_bytes for s in lasts
                 if s is not None and s.peak_allocated_bytes is not None]
        peak = max(peaks) if peaks else peak
        if not live:
            from probes.analysis.ranks import failure_text, rank_ends, read_process_exits

            failed = failure_text(rank_ends(run_dir), read_process_exits(run_dir))
            if failed:
                outcome, reason = "failed", failed
    return RunSummary(run_dir, outcome, state.step, max(1, len(files)),
                      state.device or None, state.amp or None, started, value, unit,
                      peak, reason)


def _warmup(run_dir: Path) -> int:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        warmup = json.loads((run_dir / CONFIG).read_text(encoding="utf-8")).get("warmup_steps")
        if isinstance(warmup, int) and warmup >= 0:
            return warmup
    return 0


def _last_sample(path: Path) -> StepSample | None:
    with contextlib.suppress(OSError, ValueError):
        hist = read_history(path, keep_last=1, chart_points=1)
        for row in reversed(hist.rows):
            if "event" not in row:
                return StepSample.from_json(row)
    return None
