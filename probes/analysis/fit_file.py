"""fit.json: `memtop fit`'s result in its run folder (README "Will it fit?"), written whole
after every probe point (an interrupted probe leaves a valid partial file) and once more with
the verification; read back by `memtop report` and `memtop compare`.

    doc = fit_document(meta, points, state="running")    # the fit and answer, or why none
    write_fit(run_dir, doc)                               # atomic (probes/runfolder/)
    doc = read_fit(run_dir)                               # None when the run has none

``meta``: device, budget_bytes, budget_source, headroom_pct, vary, batch_size, seq_len,
max_seq_len (the model's context), peak_name, counter_peak_name, and what the probe ran.
No torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from probes.analysis.fit import (
    FIT_FILE,
    FIT_VERSION,
    GUARD,
    INTERRUPTED,
    OK,
    OOM,
    OVER,
    FitError,
    band_at,
    fit_points,
    predict,
)
from probes.analysis.fit_answer import answer
from probes.runfolder import RunFolderError, write_json

STATES = ("running", "finished", "interrupted", "failed")


def fit_document(meta: dict[str, Any], points: list[dict[str, Any]],
                 state: str = "running") -> dict[str, Any]:
    """fit.json's content: the points, the fit and the answer, or ``fit_error`` saying why
    there is none yet (too few points)."""
    doc: dict[str, Any] = {"fit_version": FIT_VERSION, "state": state, **meta,
                           "points": points, "fit": None, "answer": None, "fit_error": None}
    try:
        fit = fit_points(points, meta.get("device") or "cpu")
    except FitError as exc:
        doc["fit_error"] = str(exc)
        return doc
    doc["fit"] = fit
    budget = meta.get("budget_bytes")
    if budget:
        doc["answer"] = answer(fit, budget, float(meta.get("headroom_pct") or 0.0),
                               meta["batch_size"], meta["seq_len"], meta.get("max_seq_len"))
    else:
        doc["fit_error"] = "no budget: the RAM or device memory could not be read"
    return doc


def fit_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / FIT_FILE


def write_fit(run_dir: str | Path, doc: dict[str, Any]) -> Path:
    path = fit_path(run_dir)
    write_json(path, doc)
    return path


def read_fit(run_dir: str | Path) -> dict[str, Any] | None:
    """fit.json of a run folder, or None when it has none; RunFolderError (one sentence)
    when the file is not a fit memtop wrote."""
    path = fit_path(run_dir)
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunFolderError(f"{path} cannot be read as JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("points"), list) \
            or doc.get("fit_version") != FIT_VERSION:
        raise RunFolderError(f"{path} is not a fit.json of this memtop (fit_version "
                             f"{FIT_VERSION})")
    return doc


def verification(what: str, point: dict[str, Any] | None, doc: dict[str, Any],
                 expect_fit: bool, exit_code: int | None, folder: str) -> dict[str, Any]:
    """One --verify run beside its prediction: the measured peak, its error, the band the
    answer stated at that size, and ``agrees``: the largest size ran under the budget with
    its measured peak within the band of the prediction (``verdict`` "agrees", "outside the
    band" when it ran under the budget but off by more, "disagrees"); the first size over was
    measured over the budget, stopped by the guard, or ran out of memory. An interrupted run
    checked nothing: ``agrees`` None, verdict "not checked"."""
    b, t = (point or {}).get("batch_size"), (point or {}).get("seq_len")
    fit = doc.get("fit")
    pred = predict(fit, b, t) if fit and b and t else {}
    status = (point or {}).get("status", "failed")
    measured = (point or {}).get("peak_bytes")
    budget = doc.get("budget_bytes") or 0
    over = status in (OVER, GUARD, OOM) or (measured is not None and measured > budget)
    row = {"what": what, "batch_size": b, "seq_len": t, "status": status,
           "reason": (point or {}).get("reason"), "exit_code": exit_code, "folder": folder,
           "expected": "fits" if expect_fit else "over budget",
           "predicted_bytes": pred.get("peak_bytes"), "measured_bytes": measured,
           "counter_predicted_bytes": pred.get("counter_peak_bytes"),
           "counter_measured_bytes": (point or {}).get("counter_peak_bytes"),
           "band": band_at(fit, b, t) if pred else None,
           "error": None, "counter_error": None,
           "guard_counter": (point or {}).get("guard_counter")}
    if measured and pred.get("peak_bytes") and status == OK:  # as the residuals: measured
        row["error"] = (measured - pred["peak_bytes"]) / measured  # minus predicted
    counter = row["counter_measured_bytes"]
    if counter and pred.get("counter_peak_bytes") and status == OK:
        row["counter_error"] = (counter - pred["counter_peak_bytes"]) / counter
    if status == INTERRUPTED:
        row["agrees"], row["verdict"] = None, "not checked"
    elif expect_fit:
        under = status == OK and not over
        within = row["error"] is not None and row["band"] is not None \
            and abs(row["error"]) <= row["band"]
        row["agrees"] = under and within
        row["verdict"] = "agrees" if row["agrees"] else (
            "outside the band" if under else "disagrees")
    else:
        row["agrees"] = over
        row["verdict"] = "agrees" if over else "disagrees"
    return row


def fit_summary(run_dir: str | Path) -> dict[str, Any] | None:
    """What `memtop compare` sets side by side from a run's fit.json (None without one)."""
    try:
        doc = read_fit(run_dir)
    except RunFolderError as exc:
        return {"error": str(exc)}
    if doc is None:
        return None
    from probes.analysis.fit_text import headline

    ans = doc.get("answer") or {}
    return {"state": doc.get("state"), "headline": headline(doc),
            "budget_bytes": doc.get("budget_bytes"), "headroom_pct": doc.get("headroom_pct"),
            "largest_batch": (ans.get("batch") or {}).get("largest"),
            "largest_seq": (ans.get("context") or {}).get("largest"),
            "today_peak_bytes": (ans.get("today") or {}).get("peak_bytes"),
            "band": (doc.get("fit") or {}).get("band"), "fit_error": doc.get("fit_error"),
            "no_answer": no_answer_text(doc)}


def no_answer_text(doc: dict[str, Any]) -> str | None:
    """Why a fit.json holds no answer, in one phrase (the screen's words); None with one."""
    if doc.get("answer"):
        return None
    from probes.analysis.fit_text import no_fit_text

    return no_fit_text(doc)
