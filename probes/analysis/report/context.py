"""What every report section reads: the run folder read once, through probes/runfolder/, with
config.json held to what the report needs and every event's fields checked against its kind's
declaration (probes/records/events.py), so a hand-edited or foreign metrics.jsonl gives n/a in
the report, not a crash.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probes import records as R
from probes.counters.host import host_info
from probes.records import EVENT_KINDS, clean, is_int
from probes.runfolder import CONFIG, RunFolderError, metrics_files, read_rows, require_config


class ReportError(ValueError):
    """The folder is not a readable run (missing, no metrics, junk, bad config): exit 2."""


GPT_SHAPE_KEYS = ("batch_size", "seq_len", "layers", "heads", "dim")
INFER_SHAPE_KEYS = ("batch_size", "prompt_len", "new_tokens", "requests", "layers", "heads",
                    "dim")
SOFTWARE_KEYS = ("python", "torch", "cuda", "cudnn", "numpy", "memtop", "os", "source")
HIDDEN_FIELDS = ("time_s", "traceback")  # recorded, but not repeated in the report


def counted(value: Any, noun: str) -> str:
    """"1 layer", "4 layers"; "n/a layers" where the run did not record the count."""
    if value is None:
        return f"n/a {noun}s"
    return f"{value} {noun}" if value == 1 else f"{value} {noun}s"


def is_gpt_config(config: dict[str, Any]) -> bool:
    """A run of memtop's own GPT (its shape is in config.json), not a user's own model: a
    Monitor names the model it watched, and a user's config may well hold a seq_len."""
    mon = config.get("monitor")
    if isinstance(mon, dict) and mon.get("model") not in (None, "GPT"):
        return False
    return all(key in config for key in ("layers", "heads", "dim"))


def check_config(config: dict[str, Any], path: Path) -> None:
    """ReportError unless the shape fields the report computes with are positive integers and
    the warmup a non-negative one.

    memtop's GPT records its shape (an inference run its own); a user's own loop (probes.Monitor)
    records what it likes, and the report says "measured only" where a formula would need the
    shape."""
    if config.get("mode") == "infer":
        shape: tuple[str, ...] = INFER_SHAPE_KEYS
    else:
        shape = GPT_SHAPE_KEYS if is_gpt_config(config) else ()
    for key in shape:
        value = config.get(key)
        if not is_int(value) or value <= 0:
            raise ReportError(f"{path}: {key} is {value!r}, not a positive integer")
    warmup = config.get("warmup_steps", 0)
    if not is_int(warmup) or warmup < 0:
        raise ReportError(f"{path}: warmup_steps is {warmup!r}, not a non-negative integer")


def warmup_steps(config: dict[str, Any]) -> int:
    """The steps before the peak counters were reset (memtop's option, or the Monitor's)."""
    mon = config.get("monitor") if isinstance(config.get("monitor"), dict) else {}
    value = config.get("warmup_steps", mon.get("warmup_steps", 0))
    return value if is_int(value) and value >= 0 else 0


def run_amp(config: dict[str, Any], started: dict[str, Any], steps: list[dict]) -> str:
    """The precision the steps ran in: a Monitor with amp="auto" learns it in the first forward
    pass, so its step rows know it and run_started does not."""
    amp = started.get("amp") or config.get("resolved_amp") or config.get("amp") or "off"
    if amp == "auto":
        amp = next((r["amp"] for r in reversed(steps) if isinstance(r.get("amp"), str)), "off")
    return str(amp)


def shown_fields(event: dict[str, Any]) -> dict[str, Any]:
    """An event as report.json repeats it: its fields without the bookkeeping."""
    return {k: v for k, v in event.items() if k not in HIDDEN_FIELDS}


def checked_event(row: dict[str, Any]) -> dict[str, Any]:
    """An event row with every field its kind declares of the declared type (others dropped);
    a kind memtop does not know keeps its fields as recorded."""
    kind = EVENT_KINDS.get(row["event"])
    return clean(row, kind.fields if kind is not None else {})


@dataclass(frozen=True)
class MetricsFile:
    """One metrics file as the report reads it: step rows in step order, checked events."""

    path: Path
    steps: list[dict[str, Any]]
    events: list[dict[str, Any]]
    bad: int  # bad lines: not JSON, or values that break the schema (a cut last line included)
    truncated: bool  # the last line was cut short (the writer was killed mid-line)
    first_bad: str | None = None  # "line N: why" of the first bad line

    @functools.cached_property
    def started(self) -> dict[str, Any]:
        """The first run_started event ({} when the run never recorded one)."""
        return next((e for e in self.events if e["event"] == R.RUN_STARTED), {})

    @functools.cached_property
    def finished(self) -> dict[str, Any] | None:
        """The last run_finished event; None when the run was killed or is still going."""
        return next((e for e in reversed(self.events) if e["event"] == R.RUN_FINISHED), None)

    @property
    def end(self) -> str | None:
        """Why the run ended, as its run_finished row says (None without one)."""
        return self.finished.get("reason") if self.finished else None

    def named(self, *names: str) -> list[dict[str, Any]]:
        """The events of these kinds, in file order."""
        return [e for e in self.events if e["event"] in names]


def read_metrics_file(path: Path) -> MetricsFile:
    """A metrics file read through probes/runfolder/reader.py; ReportError if unreadable."""
    try:
        rows = read_rows(path)
    except RunFolderError as exc:
        raise ReportError(str(exc)) from None
    steps = sorted(rows.steps, key=lambda r: r["step"])
    return MetricsFile(path, steps, [checked_event(e) for e in rows.events], rows.bad,
                       rows.truncated, rows.first_bad)


@dataclass
class ReportContext:
    """The run as every section reads it. ``built`` fills as sections are built: a summary
    section (the finding) reads what the others built."""

    run_dir: Path
    config: dict[str, Any]
    metrics: MetricsFile  # metrics.jsonl, or rank 0's file under several ranks
    ranks: dict[int | None, MetricsFile]  # every rank's file; empty for a lone process
    built: dict[str, Any] = field(default_factory=dict)

    @property
    def mode(self) -> str:
        """"infer", "fit" (`memtop fit`'s probe: several shapes, no training run) or
        "train"."""
        mode = self.config.get("mode")
        return mode if mode in ("infer", "fit") else "train"

    @property
    def steps(self) -> list[dict[str, Any]]:
        return self.metrics.steps

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.metrics.events

    @property
    def started(self) -> dict[str, Any]:
        return self.metrics.started

    @property
    def finished(self) -> dict[str, Any] | None:
        return self.metrics.finished

    @functools.cached_property
    def amp(self) -> str:
        return run_amp(self.config, self.started, self.steps)

    @functools.cached_property
    def system(self) -> dict[str, Any]:
        """The machine as the run recorded it at its start, else as this process sees it."""
        system = self.started.get("system")
        if isinstance(system, dict):
            return system
        return dict(host_info(), source="report time (the run did not record it)")

    @functools.cached_property
    def last_ledger(self) -> dict[str, Any] | None:
        """The last ledger event that holds its lines (the ledger moves during a run)."""
        ledgers = self.ledgers
        return ledgers[-1] if ledgers else None

    @functools.cached_property
    def ledgers(self) -> list[dict[str, Any]]:
        return [e for e in self.metrics.named(R.LEDGER) if isinstance(e.get("lines"), list)]


def load_context(run_dir: Path) -> ReportContext:
    """The run folder read for the report; ReportError when it is not a run to report on."""
    if not run_dir.exists():
        raise ReportError(f"{run_dir} does not exist")
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir} is not a folder")
    files = metrics_files(run_dir)
    if not files:
        raise ReportError(f"{run_dir} has no metrics.jsonl: not a memtop run folder")
    try:
        config = require_config(run_dir)
    except RunFolderError as exc:
        raise ReportError(str(exc)) from None
    check_config(config, run_dir / CONFIG)
    read = {rank: read_metrics_file(path) for rank, path in files.items()}
    metrics = next(iter(read.values()))
    if not metrics.steps and not metrics.events:
        what = (f"{metrics.bad} bad lines (first: {metrics.first_bad})" if metrics.bad
                else "no rows")
        raise ReportError(f"{metrics.path} holds {what}: nothing to report")
    return ReportContext(run_dir, config, metrics, read if len(read) > 1 else {})
