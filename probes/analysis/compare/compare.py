"""A/B comparison of run folders (tutorial §6.1 and §6.2): what changed between the runs, whether
the later ones are faster or smaller beyond the noise, and whether a lower precision still trains
the same. Also the headline figures of one run, which `memtop sweep` and `--baseline` read.

Pure: run folders are read with probes/runfolder/; results are JSON-able dicts. No torch, no
Textual. The rules (noise, tolerance) are stated in the result, so the report says what it did.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probes import records as R
from probes.analysis.compare.modules import last_window, module_changes
from probes.analysis.compare.phases import phase_changes
from probes.analysis.compare.stats import (
    BOOTSTRAP_RESAMPLES,
    decreasing,
    loss_agreement,
    median_ratio,
    speed_verdict,
)
from probes.analysis.compare.windows import DEFAULT_LOSS_TOLERANCE, profile_windows, windows_summary
from probes.analysis.fit_file import fit_summary
from probes.analysis.measured import measured_steps, peak_steps
from probes.analysis.runlist import run_outcome
from probes.analysis.step_split import phase_values
from probes.records import finite_num, record_from_json
from probes.runfolder import (
    RunFolderError,
    check_run_folder,
    metrics_files,
    read_config,
    read_rows,
)
from probes.runfolder.state import RunState
from probes.tools.stats import band, percentile

# where it was written, what it compares with; the resolved device and amp replace the options
IGNORED_VARIABLES = ("run_dir", "baseline", "resolved_device", "resolved_amp")
MODEL_KEYS = ("layers", "heads", "dim")  # a different model needs --force to be compared
NOISE_RULE = ("median over the measured steps (after warmup, the steps memtop's profiler or "
              "culprit look disturbed left out), "
              "band = p25-p75 of the per-step values; the change is the ratio of the medians "
              f"with a 95% bootstrap interval ({BOOTSTRAP_RESAMPLES} resamples of the per-step "
              "rows); a change is measurable only when the interval excludes 1 and B's median "
              "lies outside A's p25-p75 band, otherwise it is called \"no measurable "
              "difference\". The interval is the noise within each run; a repeated "
              "baseline (a run with nothing changed, given after A) measures the "
              "run-to-run noise of a shared machine, and a change no larger than it is "
              "also called no measurable difference.")


class CompareError(RunFolderError):
    """The runs cannot be compared as asked (different models, too few runs): exit 2."""


@dataclass
class RunFigures:
    """One run folder's figures, as a comparison or a sweep cell needs them."""

    run_dir: Path
    config: dict[str, Any]
    variables: dict[str, Any]  # config.json without IGNORED_VARIABLES; amp/device as resolved
    params: int | None
    outcome: str  # finished | stopped | interrupted | failed | live | empty
    reason: str | None
    error_type: str | None
    memory_guard: bool  # --max-memory stopped it
    steps_recorded: int
    stats_over: str
    tokens_per_s: list[float]  # per measured step
    step_ms: list[float]
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    driver_peak_bytes: int | None
    skipped_steps: int
    losses: dict[int, float] = field(default_factory=dict)  # step -> finite loss
    windows: list[dict[str, Any]] = field(default_factory=list)  # profiler windows taken
    phases: dict[str, list[float]] = field(default_factory=dict)  # step split, measured steps
    modules: dict[str, Any] | None = None  # the last memory attribution window's event
    fit: dict[str, Any] | None = None  # `memtop fit`'s answer (fit.json), where the run has one

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def kind(self) -> str:
        """"training", "inference" or "fit probe" (`memtop fit`: steps of several shapes):
        their steps are different work, never compared."""
        return {"infer": "inference", "fit": "fit probe"}.get(self.config.get("mode"),
                                                              "training")

    def headline(self) -> dict[str, Any]:
        """The figures `--baseline` and the sweep table show, JSON-able."""
        return {"run_dir": str(self.run_dir), "outcome": self.outcome, "reason": self.reason,
                "steps": self.steps_recorded, "measured_steps": len(self.step_ms),
                "stats_over": self.stats_over,
                "tokens_per_s": band(self.tokens_per_s), "step_ms": band(self.step_ms),
                "step_ms_p95": percentile(self.step_ms, 95),
                "peak_allocated_bytes": self.peak_allocated_bytes,
                "peak_reserved_bytes": self.peak_reserved_bytes,
                "driver_peak_bytes": self.driver_peak_bytes,
                "skipped_steps": self.skipped_steps,
                "final_loss": self.losses[max(self.losses)] if self.losses else None,
                "amp": self.variables.get("amp"), "device": self.variables.get("device")}


def _max(rows: list[dict[str, Any]], key: str) -> int | None:
    vals = [v for v in (finite_num(r.get(key)) for r in rows) if v is not None]
    return int(max(vals)) if vals else None


def load_run(path: str | Path) -> RunFigures:
    """A run folder's figures; RunFolderError (one sentence) when it is not a readable run."""
    run_dir = check_run_folder(path)
    files = metrics_files(run_dir)
    if not files:
        raise RunFolderError(f"{run_dir} has no metrics.jsonl: the run never started")
    rank, first = next(iter(files.items()))
    rows = read_rows(first)  # a lone process, or the first rank
    steps = sorted(rows.steps, key=lambda r: r["step"])
    state = RunState()
    for row in rows.rows:
        with contextlib.suppress(ValueError):
            state.apply(record_from_json(row))
    if not state.records:
        raise RunFolderError(f"{run_dir} holds no readable rows")
    config = read_config(run_dir)
    warmup = config.get("warmup_steps", 0)
    warmup = warmup if isinstance(warmup, int) and warmup >= 0 else 0
    measured, over = measured_steps(steps, warmup) if steps else ([], "no steps")
    variables = {k: v for k, v in config.items() if k not in IGNORED_VARIABLES}
    if state.amp:
        variables["amp"] = state.amp  # "auto" resolves differently per machine: compare what ran
    if state.device:
        variables["device"] = state.device
    error = next((e for e in rows.events if e.get("event") == R.ERROR), None)
    peak_rows = peak_steps(steps, warmup)  # the report's rule: its peak and compare's agree
    last = steps[-1] if steps else {}
    skipped = last.get("skipped_steps")
    losses = {r["step"]: v for r in steps if (v := finite_num(r.get("loss"))) is not None}
    return RunFigures(
        run_dir=run_dir, config=config, variables=variables,
        params=state.params if isinstance(state.params, int) and state.params else None,
        outcome=run_outcome(state, run_dir, rank), reason=state.error or state.stop_reason,
        error_type=str(error.get("error_type")) if error else None,
        memory_guard=any(e.get("event") == R.MEMORY_GUARD for e in rows.events),
        steps_recorded=len(steps), stats_over=over,
        tokens_per_s=[v for r in measured if (v := finite_num(r.get("tokens_per_s"))) is not None],
        step_ms=[v for r in measured if (v := finite_num(r.get("step_ms"))) is not None],
        peak_allocated_bytes=_max(peak_rows, "peak_allocated_bytes"),
        peak_reserved_bytes=_max(peak_rows, "reserved_bytes"),
        driver_peak_bytes=_max(peak_rows, "driver_used_bytes"),
        skipped_steps=skipped if isinstance(skipped, int) and skipped >= 0 else 0,
        losses=losses, windows=profile_windows(rows.events, steps, run_dir),
        phases=phase_values(measured), modules=last_window(rows.events),
        fit=fit_summary(run_dir))


# ---- the rules ---------------------------------------------------------------------------------
IGNORED_FIELDS = ("fit.points",)  # `memtop fit`'s planned grid: from B, T and fit.vary
PROBE_SPEED = ("n/a: `memtop fit` probes run several shapes each (their refine points follow "
               "the answer), so their step times are no one workload's")


def _flat(variables: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested option group (config.json's ``fit``, a Monitor's ``monitor``) as its fields,
    each a variable of its own named ``group.field``."""
    out: dict[str, Any] = {}
    for key, value in variables.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, f"{name}."))
        elif name not in IGNORED_FIELDS:
            out[name] = value
    return out


def changed_variables(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """[{name, a, b}] for every variable whose value differs (a missing one reads as None);
    a nested group's fields are named one by one (``fit.memory``), never the group's dict."""
    a, b = _flat(a), _flat(b)
    names = sorted(set(a) | set(b))
    return [{"name": k, "a": a.get(k), "b": b.get(k)} for k in names if a.get(k) != b.get(k)]


def one_variable_warning(changed: list[dict[str, Any]]) -> str | None:
    """§6.1: a change can be put down to one cause only when one variable changed."""
    if len(changed) <= 1:
        return None
    names = ", ".join(c["name"] for c in changed)
    return (f"{len(changed)} variables changed ({names}): a difference cannot be put down to "
            "any one of them (tutorial §6.1: change one variable at a time)")


def model_difference(a: RunFigures, b: RunFigures) -> str | None:
    """A sentence when the two runs train different models; None when they are the same."""
    diffs = [f"{k} {a.config.get(k)} vs {b.config.get(k)}" for k in MODEL_KEYS
             if a.config.get(k) != b.config.get(k)]
    if not diffs and a.params and b.params and a.params != b.params:
        diffs.append(f"params {a.params} vs {b.params}")
    return ", ".join(diffs) or None


def compare_figures(a: RunFigures, b: RunFigures,
                    tolerance: float = DEFAULT_LOSS_TOLERANCE) -> dict[str, Any]:
    """B against the baseline A: changes, speed with its noise, peaks, skipped steps, losses."""
    changed = changed_variables(a.variables, b.variables)
    tps = median_ratio(a.tokens_per_s, b.tokens_per_s)
    ms = median_ratio(a.step_ms, b.step_ms)

    def ratio(x: int | None, y: int | None) -> float | None:
        return y / x if x and y is not None else None

    out: dict[str, Any] = {
        "run": str(b.run_dir), "changed": changed, "warning": one_variable_warning(changed),
        "same_folder": a.run_dir.resolve() == b.run_dir.resolve(),  # not a second run: no A/A
        "tokens_per_s": tps, "tokens_per_s_verdict": speed_verdict(tps),
        "step_ms": ms, "step_ms_verdict": speed_verdict(ms, higher_is_better=False),
        "peaks": {k: {"a": getattr(a, k), "b": getattr(b, k),
                      "ratio": ratio(getattr(a, k), getattr(b, k))}
                  for k in ("peak_allocated_bytes", "peak_reserved_bytes", "driver_peak_bytes")},
        "devices": {"a": a.variables.get("device"), "b": b.variables.get("device")},
        "skipped_steps": {"a": a.skipped_steps, "b": b.skipped_steps},
        "loss": loss_agreement(a.losses, b.losses, tolerance),
        "precision_check": None,
        "profiler": None,
        "phases": phase_changes(a.phases, b.phases, median_ratio),  # which phase moved
        "modules": module_changes(a.modules, b.modules),  # which module's memory moved
    }
    if a.fit or b.fit:  # `memtop fit` runs: their answers side by side
        out["fit"] = {"a": a.fit, "b": b.fit}
    if a.kind == "fit probe":  # steps of several shapes each: no one workload's speed
        out["tokens_per_s_verdict"] = out["step_ms_verdict"] = PROBE_SPEED
        del out["phases"]
    if a.windows or b.windows:
        wa, wb = windows_summary(a.windows), windows_summary(b.windows)
        out["profiler"] = {"a": wa, "b": wb, "active_step_ms": median_ratio(
            [v for w in a.windows for v in w["active_step_ms"]],
            [v for w in b.windows for v in w["active_step_ms"]])}
    amp_a, amp_b = a.variables.get("amp"), b.variables.get("amp")
    if amp_a != amp_b:
        out["precision_check"] = {
            "amp": [amp_a, amp_b],
            "finite": {"a": a.error_type is None, "b": b.error_type is None},
            "errors": {"a": a.reason if a.error_type else None,
                       "b": b.reason if b.error_type else None},
            "decreasing": {"a": decreasing(a.losses), "b": decreasing(b.losses)},
            "agreement": out["loss"]}
    return out


def compare_runs(paths: list[str | Path], force: bool = False,
                 tolerance: float = DEFAULT_LOSS_TOLERANCE) -> dict[str, Any]:
    """The first run is the baseline; every other is compared with it. CompareError / a
    RunFolderError (one sentence each) when they cannot be."""
    if len(paths) < 2:
        raise CompareError("compare needs at least two run folders (the first is the baseline)")
    runs = [load_run(p) for p in paths]
    base = runs[0]
    for other in runs[1:]:
        if other.kind != base.kind:  # --force or not: a decode step is not a training step
            raise CompareError(f"{base.name} is {_a(base.kind)} run and {other.name} "
                               f"{_a(other.kind)} run: their steps are different work; "
                               "compare runs of one kind")
        diff = model_difference(base, other)
        if diff and not force:
            raise CompareError(f"{base.name} and {other.name} train different models ({diff}); "
                               "pass --force to compare them anyway")
    comparisons = [compare_figures(base, r, tolerance) for r in runs[1:]]
    return {"baseline": base.headline(), "runs": [r.headline() for r in runs[1:]],
            "comparisons": comparisons, "run_to_run_noise": apply_run_to_run_noise(comparisons),
            "noise_rule": NOISE_RULE, "loss_tolerance": tolerance,
            "loss_curves": [loss_curve(r) for r in runs]}


def _a(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def loss_curve(run: RunFigures, points: int = 400) -> dict[str, Any]:
    """The run's loss per step, thinned evenly to about ``points`` for charts."""
    steps = sorted(run.losses)
    stride = max(1, math.ceil(len(steps) / points))
    kept = steps[::stride]
    return {"run": run.name, "steps": kept, "loss": [run.losses[s] for s in kept]}


def apply_run_to_run_noise(comparisons: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A repeated baseline (a run with nothing changed: A/A) measures the run-to-run noise that
    the per-step interval cannot see. A change no larger than the A/A difference is then
    called no measurable difference either. None when no A/A run was given, or only such runs
    (a lone run with the same config is judged as any other: a change of the code, not of the
    config, is the usual reason to compare two such runs, and --fail-if-slower gates it)."""
    aa = [c for c in comparisons if not c["changed"] and not c.get("same_folder")]
    if not aa or len(aa) == len(comparisons):
        return None  # no run it could apply to: its floor would be its own difference
    floor: dict[str, Any] = {"from": [Path(c["run"]).name for c in aa]}
    for key, better in (("tokens_per_s", True), ("step_ms", False)):
        devs = [abs(c[key]["ratio"] - 1) for c in aa if c[key] is not None]
        floor[key] = max(devs) if devs else None
        for c in comparisons:
            change = c[key]
            if c in aa or change is None or floor[key] is None:
                continue
            change["within_run_to_run_noise"] = abs(change["ratio"] - 1) <= floor[key]
            if change["within_run_to_run_noise"] and change["measurable"]:
                change["measurable"] = False
            c[f"{key}_verdict"] = speed_verdict(change, better) + (
                f" (A/A run-to-run noise ±{floor[key]:.1%})"
                if change["within_run_to_run_noise"] else "")
    return floor


def gate(result: dict[str, Any], slower_pct: float | None,
         bigger_pct: float | None) -> list[str]:
    """Sentences for each run that is measurably slower by more than ``slower_pct`` % (tokens/s,
    else step time) or whose peak allocated is more than ``bigger_pct`` % above the baseline."""
    failures = []
    for c in result["comparisons"]:
        name = Path(c["run"]).name
        if slower_pct is not None:
            tps, ms = c["tokens_per_s"], c["step_ms"]
            slow = None
            if tps is not None:
                slow = (1 - tps["ratio"]) * 100 if tps["measurable"] else 0.0
            elif ms is not None:
                slow = (ms["ratio"] - 1) * 100 if ms["measurable"] else 0.0
            if slow is not None and slow > slower_pct:
                failures.append(f"{name} is {slow:.1f}% slower than the baseline "
                                f"(--fail-if-slower {slower_pct:g})")
        peak = c["peaks"]["peak_allocated_bytes"]["ratio"]
        if bigger_pct is not None and peak is not None and (peak - 1) * 100 > bigger_pct:
            failures.append(f"{name}'s peak allocated is {(peak - 1) * 100:.1f}% above the "
                            f"baseline's (--fail-if-bigger {bigger_pct:g})")
    return failures
