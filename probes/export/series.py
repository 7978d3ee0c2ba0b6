"""One rank of one run as Prometheus sees it (``RankSeries``: built from a RunState, the same
fold every reader of a run uses), and the metric families made from a list of them: the one
place where rows and events become metrics (probes/export/names.py declares them).

A value that is not a finite number is left out of the scrape, never exported as NaN or inf.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.metrics_core import Metric

from probes.export.names import (
    GPU_UUID,
    INFO_HELP,
    INFO_LABELS,
    LEAK_ALERT_HELP,
    LEAK_RATE_HELP,
    PHASE_HELP,
    PHASES,
    STATE_HELP,
    STATES,
    STEP_METRICS,
    TO_FULL_HELP,
    UNREADABLE_HELP,
    device_kind,
    help_text,
)
from probes.records import StepSample
from probes.records.values import finite_num
from probes.runfolder.state import RunState


@dataclass(frozen=True)
class RankSeries:
    """What one rank's series say at one scrape (read from its RunState, copied: the scrape
    never holds the fold that another thread goes on updating)."""

    run: str  # the run folder's name: <YYYYmmdd-HHMMSS>-<id>
    rank: int
    host: str
    device: str  # "cpu", "cuda:0"
    state: str  # one of names.STATES
    sample: StepSample | None = None  # the last step row
    alerts: tuple[Mapping[str, Any], ...] = ()  # the open leak alerts' data
    info: Mapping[str, str] = field(default_factory=dict)  # names.INFO_LABELS
    gpu_uuid: str | None = None
    unreadable_rows: int = 0

    @property
    def labels(self) -> dict[str, str]:
        labels = {"run": self.run, "rank": str(self.rank), "host": self.host,
                  "device": self.device}
        if self.gpu_uuid and device_kind(self.device) == "cuda":
            labels[GPU_UUID] = self.gpu_uuid
        return labels


def rank_series(run: str, rank: int | None, host: str, state: RunState, outcome_state: str,
                config: Mapping[str, Any], unreadable_rows: int = 0) -> RankSeries:
    """A rank's series from the fold of its records (``state``), the state word the caller
    decided (``outcome_state``: its run_finished, or its socket, says it) and config.json."""
    started = dict(state.started or {})
    system = started.get("system") if isinstance(started.get("system"), dict) else {}
    sample = state.last_sample
    device = (sample.device if sample is not None else "") or state.device or "cpu"
    monitor = config.get("monitor") if isinstance(config.get("monitor"), dict) else {}
    model = monitor.get("model") or ("GPT (memtop's mini-GPT)" if "layers" in config and
                                     "dim" in config else "")
    amp = state.amp or str(started.get("amp") or "")
    info = {"amp": amp, "model": str(model), "device_name": state.device_name or device,
            "torch_version": str(system.get("torch") or ""),
            "memtop_version": str(system.get("memtop") or ""),
            "params": str(state.params or ""), "world_size": str(started.get("world_size") or 1),
            "counters": str(state.counters or "")}
    uuid = system.get("gpu_uuid") if isinstance(system.get("gpu_uuid"), str) else None
    return RankSeries(run, rank or 0, host, device, outcome_state, sample,
                      tuple(dict(a) for a in list(state.alerts.values())),
                      {k: info[k] for k in INFO_LABELS}, uuid, unreadable_rows)


def _metric(name: str, doc: str, kind: str, unit: str = "") -> Metric:
    return Metric(name, doc, kind, unit)


def families(series: Iterable[RankSeries]) -> list[Metric]:
    """Every exported metric family over ``series`` (in names.py's order). A family with no
    sample is still described, so a dashboard finds the name before the first run."""
    series = list(series)
    kinds = {device_kind(s.device) for s in series}
    out: list[Metric] = []
    for spec in STEP_METRICS:
        metric = _metric(spec.name, help_text(spec.cuda, spec.cpu, kinds), spec.kind, spec.unit)
        sample_name = spec.name + ("_total" if spec.kind == "counter" else "")
        for s in series:
            value = getattr(s.sample, spec.field, None) if s.sample is not None else None
            _add(metric, sample_name, s.labels, value, spec.scale)
        out.append(metric)
    phase = _metric("memtop_phase_seconds", help_text(*PHASE_HELP, kinds), "gauge", "seconds")
    for s in series:
        for name, row_field in PHASES.items():
            value = getattr(s.sample, row_field, None) if s.sample is not None else None
            _add(phase, "memtop_phase_seconds", {**s.labels, "phase": name}, value, 1e-3)
    out.append(phase)
    alert = _metric("memtop_leak_alert", LEAK_ALERT_HELP, "gauge")
    rate = _metric("memtop_leak_bytes_per_step", LEAK_RATE_HELP, "gauge")
    to_full = _metric("memtop_seconds_to_full", TO_FULL_HELP, "gauge")
    for s in series:
        alert.add_sample("memtop_leak_alert", s.labels, 1.0 if s.alerts else 0.0)
        rates = [v for a in s.alerts if (v := finite_num(a.get("bytes_per_step"))) is not None]
        _add(rate, "memtop_leak_bytes_per_step", s.labels, max(rates) if rates else None)
        fills = [v for a in s.alerts if (v := finite_num(a.get("seconds_to_full"))) is not None]
        _add(to_full, "memtop_seconds_to_full", s.labels, min(fills) if fills else None)
    out += [alert, rate, to_full]
    info = _metric("memtop_run_info", INFO_HELP, "gauge")
    state = _metric("memtop_run_state", STATE_HELP, "gauge")
    unreadable = _metric("memtop_unreadable_rows", UNREADABLE_HELP, "counter")
    for s in series:
        info.add_sample("memtop_run_info", {**s.labels, **s.info}, 1.0)
        for name in STATES:
            state.add_sample("memtop_run_state", {**s.labels, "state": name},
                             1.0 if name == s.state else 0.0)
        unreadable.add_sample("memtop_unreadable_rows_total", s.labels, float(s.unreadable_rows))
    out += [info, state, unreadable]
    return out


def _add(metric: Metric, name: str, labels: dict[str, str], value: Any,
         scale: float = 1.0) -> None:
    """A sample when ``value`` is a finite number (a bool is not one); nothing otherwise."""
    number = finite_num(value)
    if number is not None and math.isfinite(number * scale):
        metric.add_sample(name, labels, number * scale)
