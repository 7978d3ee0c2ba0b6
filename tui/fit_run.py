"""Runs `memtop fit`: the probe on its training thread (trainer/fitprobe.py), fit.json after
every point, the one screen at the end, and --verify's runs, each a fresh
`python -m trainer.fitprobe` process with the budget as its --max-memory.

Ctrl-C / SIGTERM / a lost terminal stop the probe at its next step boundary (the point in
flight is "interrupted", fit.json keeps the fit of the points before it) or the verification
run in flight (asked to stop the same way); a second one leaves at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from probes import records as R
from probes.analysis.fit import FAILED, FRESH, GUARD, INTERRUPTED, OK, OOM, OVER
from probes.analysis.fit_file import fit_document, verification, write_fit
from probes.analysis.fit_text import fit_lines
from probes.control.requests import RunControl
from probes.records import Event, Record
from probes.records.event_text import fit_point_text
from probes.runfolder import read_rows
from trainer.config import TrainConfig
from trainer.exit_codes import (
    EXIT_FAILED,
    EXIT_MEMORY_GUARD,
    EXIT_SIGHUP,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    EXIT_USAGE,
)
from tui.output import say

VERIFY_STEPS = 3  # measured steps of each verification run, after the probe's warm-up
CHILD_STOP_WAIT_S = 60.0


@dataclass
class FitPlan:
    config: TrainConfig
    run_dir: Path
    points: list[tuple[int, int]]
    budget_bytes: int | None = None
    headroom_pct: float = 10.0
    vary: str = "both"
    verify: bool = False
    command: str = ""
    meta: dict[str, Any] = field(default_factory=dict)  # filled as the probe learns it
    fresh: list[dict[str, Any]] = field(default_factory=list)  # the run-to-run point


class PointPrinter:
    """A sink: one line per probe point as it is measured (fit_point's own sentence), counted
    by its role: "point 3/5" for the planned probe, "refine 1" for the points the probe adds
    nearer a far answer (how many depends on the answer)."""

    def __init__(self, total: int, out: TextIO) -> None:
        self.total, self.out = total, out
        self.seen: dict[str, int] = {}

    def __call__(self, record: Record) -> None:
        if isinstance(record, Event) and record.event == R.FIT_POINT:
            role = str(record.data.get("role") or "probe")
            n = self.seen[role] = self.seen.get(role, 0) + 1
            label = {"probe": f"point {n}/{self.total}", "refine": f"refine {n}"}.get(role,
                                                                                   role)
            say(self.out, f"{label}  {record.summary()}")


def run_fit(plan: FitPlan, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    from trainer.fitprobe import REFINE_ROUNDS, FitProbe

    refine = REFINE_ROUNDS * (2 if plan.vary == "both" else 1)  # one a round per axis varied
    say(out, f"memtop: fit folder {plan.run_dir} ({len(plan.points)} probe points; then up to "
             f"{refine} refine points nearer the answer, and the largest again in a fresh "
             "process)")

    control = RunControl()
    received: list[int] = []
    probe = FitProbe(plan.config, plan.run_dir, plan.points, budget_bytes=plan.budget_bytes,
                     headroom_pct=plan.headroom_pct,
                     on_point=lambda p: write_fit(plan.run_dir, _document(plan, p, "running")),
                     control=control, sinks=[PointPrinter(len(plan.points), out)])
    probe.session.recorder.add_to_config(fit={"vary": plan.vary, "memory": plan.budget_bytes,
                                              "headroom_pct": plan.headroom_pct,
                                              "points": [list(p) for p in plan.points]})
    old = _on_signals(received, control)
    try:
        probe.start()
        while not probe.join(timeout=0.2):
            pass
        if probe.refused:
            say(sys.stderr, f"memtop fit: {probe.refused}")
            return EXIT_USAGE
        state = "interrupted" if received else (
            "finished" if probe.exit_code == 0 else "failed")
        doc = _document(plan, probe, state)
        write_fit(plan.run_dir, doc)
        if state == "finished" and doc.get("fit"):  # the band's run-to-run part, measured
            plan.fresh.append(_fresh(plan, probe, doc, received, out))
            state = "interrupted" if received else state
            doc = _document(plan, probe, state)
            write_fit(plan.run_dir, doc)
        if plan.verify and state == "finished" and doc.get("answer"):
            doc["verification"] = _verify(plan, probe, doc, received, out)
            if received:
                doc["state"] = "interrupted"
            write_fit(plan.run_dir, doc)
    except KeyboardInterrupt:  # a second Ctrl-C: what fit.json holds is what was measured
        say(out, "memtop: interrupted again; fit.json holds the points measured so far")
        return EXIT_SIGINT
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    say(out, "")
    for line in fit_lines(doc):
        say(out, line)
    from tui.finish import finish_run

    say(out, f"memtop: fit.json {plan.run_dir / 'fit.json'}")
    finish_run(plan.run_dir, out)
    if received:
        return {signal.SIGINT: EXIT_SIGINT, signal.SIGHUP: EXIT_SIGHUP}.get(received[0],
                                                                             EXIT_SIGTERM)
    return finished_code(doc)


def finished_code(doc: dict[str, Any]) -> int:
    """A probe that ran to its end: 0 with an answer; 3 when the budget left none (a point
    measured over it, stopped by the guard, out of memory: nothing, or too little, fits);
    1 when the probe failed or its points made no fit."""
    if doc.get("state") == "failed":
        return EXIT_FAILED
    if doc.get("answer"):
        return 0
    stopped = any(p.get("status") in (OVER, GUARD, OOM) for p in doc.get("points") or [])
    return EXIT_MEMORY_GUARD if stopped else EXIT_FAILED


def _document(plan: FitPlan, probe: Any, state: str) -> dict[str, Any]:
    from probes.records.names import peak_name

    cfg = plan.config
    device = probe.device_text or cfg.device
    meta = {"command": plan.command, "device": device, "amp": probe.amp or cfg.amp,
            "attention": cfg.attention, "params": probe.params or cfg.param_count(),
            "budget_bytes": probe.budget_bytes, "budget_source": probe.budget_source,
            "headroom_pct": plan.headroom_pct, "vary": plan.vary,
            "batch_size": cfg.batch_size, "seq_len": cfg.seq_len,
            "max_seq_len": cfg.block_size, "peak_source": probe.peak_source,
            "peak_name": ("peak reserved" if device.startswith("cuda")
                          else "peak RSS"),
            "counter_peak_name": peak_name("allocated", device),
            "warmup_steps": probe.warmup, "measured_steps": probe.steps,
            "held_bytes": probe.held_bytes,
            "planned_points": [list(p) for p in plan.points],
            "error": probe.status.error if state == "failed" else None}
    return fit_document(meta, [*probe.points, *plan.fresh], state)


# ---- fresh processes: the run-to-run point and --verify ----------------------------------------
def _fresh(plan: FitPlan, probe: Any, doc: dict[str, Any], received: list[int],
           out: TextIO) -> dict[str, Any]:
    """The probe's largest point once more in a fresh process (role FRESH): how far it lies
    from the prediction is the run-to-run part of the band (probes/analysis/fit.py)."""
    ok = [p for p in probe.points if p.get("status") == OK]
    big = max(ok, key=lambda p: (p["batch_size"] * p["seq_len"], p["batch_size"]))
    b, t = big["batch_size"], big["seq_len"]
    folder = plan.run_dir / "fresh" / f"b{b}-t{t}"
    say(out, f"fresh    B={b} T={t} again in a fresh process (run to run; {folder.name})")
    code = _run_child(plan, probe, folder, b, t, doc["budget_bytes"], received, FRESH,
                      probe.steps)
    point = _child_point(folder) or {"batch_size": b, "seq_len": t, "status": FAILED,
                                     "reason": f"its process exited {code} before a point"}
    if received and point.get("status") != OK:
        point.update(status=INTERRUPTED, reason=point.get("reason") or "interrupted")
    point["role"] = FRESH
    say(out, f"fresh    {fit_point_text(point)}")
    return point


# ---- --verify ---------------------------------------------------------------------------------
def verify_runs(doc: dict[str, Any]) -> list[tuple[str, int, int, bool]]:
    """(what, B, T, expected to fit) for each verification run the answer calls for."""
    ans = doc["answer"]
    b, c = ans["batch"], ans["context"]
    runs = []
    if b.get("largest"):
        runs.append(("largest B", b["largest"], b["seq_len"], True))
        runs.append(("first B over", b["over"], b["seq_len"], False))
    if c.get("largest") and c["largest"] != b.get("seq_len"):
        runs.append(("largest T", c["batch_size"], c["largest"], True))
    if c.get("largest") and c.get("over"):
        runs.append(("first T over", c["batch_size"], c["over"], False))
    return runs


def _verify(plan: FitPlan, probe: Any, doc: dict[str, Any], received: list[int],
            out: TextIO) -> list[dict[str, Any]]:
    rows = []
    for what, b, t, fits in verify_runs(doc):
        if received:
            break
        folder = plan.run_dir / "verify" / f"b{b}-t{t}"
        say(out, f"verify: {what} B={b} T={t} in a fresh process ({folder.name})")
        code = _run_child(plan, probe, folder, b, t, doc["budget_bytes"], received, "verify",
                          VERIFY_STEPS)
        point = _child_point(folder)
        if received and (point is None or point.get("status") != OK):  # stopped: unchecked
            point = dict(point or {"batch_size": b, "seq_len": t}, status=INTERRUPTED,
                         reason=(point or {}).get("reason") or "interrupted")
        rows.append(verification(what, point, doc, fits, code,
                                 str(folder.relative_to(plan.run_dir))))
    return rows


def _run_child(plan: FitPlan, probe: Any, folder: Path, b: int, t: int, budget: int,
               received: list[int], role: str, steps: int) -> int | None:
    cfg = replace(plan.config, batch_size=b, seq_len=t, max_memory_bytes=budget,
                  warmup_steps=probe.warmup, steps=0, save_weights=False)
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "trainer.fitprobe", "--run-folder", str(folder),
           "--config", json.dumps(cfg.to_json()), "--points", f"{b}x{t}",
           "--budget", str(budget), "--steps", str(steps), "--role", role]
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])  # this source tree first, as the parent
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    with open(folder.parent / f"{folder.name}.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        while True:
            try:
                return _status(proc.wait(timeout=0.2))
            except subprocess.TimeoutExpired:
                if received:  # stop it at its next step boundary, as the probe was
                    with contextlib.suppress(OSError):
                        proc.send_signal(signal.SIGINT)
                    try:
                        return _status(proc.wait(timeout=CHILD_STOP_WAIT_S))
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        return _status(proc.wait())


def _status(code: int) -> int:
    """A child's exit status as a shell says it: killed by a signal (Ctrl-C before its
    handler was set, during torch's import) is 128 + the signal, as memtop exits itself."""
    return 128 - code if code < 0 else code


def _child_point(folder: Path) -> dict[str, Any] | None:
    """The child's fit_point event (the last one), or None when it wrote none."""
    try:
        rows = read_rows(folder / "metrics.jsonl")
    except Exception:
        return None
    points = [e for e in rows.events if e.get("event") == R.FIT_POINT]
    if not points:
        return None
    point = dict(points[-1])
    guard = next((e for e in rows.events if e.get("event") == R.MEMORY_GUARD), None)
    if guard is not None and point.get("peak_bytes") is None:  # stopped before a measured
        point["peak_bytes"] = guard.get("watched_bytes")  # step: what the guard saw
    if guard is not None:  # the guard stopped it, after its last measured step too (a point
        point["guard_counter"] = guard.get("counter")  # whose peak passed the budget)
        if point.get("status") in (OK, OVER):
            point["status"] = GUARD
            finished = next((e for e in rows.events if e.get("event") == R.RUN_FINISHED), {})
            point["reason"] = finished.get("reason") or point.get("reason")
    return point


def _on_signals(received: list[int], control: RunControl) -> dict[int, Any]:
    """The first Ctrl-C / SIGTERM / SIGHUP stops the probe at a step boundary (and a
    verification run); a second one raises KeyboardInterrupt. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum: int, _frame: object) -> None:
        received.append(signum)
        if len(received) > 1 and signum != signal.SIGHUP:
            raise KeyboardInterrupt
        control.stop(f"interrupted ({signal.Signals(signum).name})",
                     urgent=signum == signal.SIGHUP)

    old: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
            continue
        old[sig] = signal.signal(sig, handler)
    return old
