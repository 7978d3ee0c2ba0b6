"""`memtop fit`'s one screen (≤ 80 columns), from fit.json's content: the probe points with
their residuals, the largest B and T with their predicted peaks, what moves the limit, and the
verification. The report's "Will it fit?" section shows the same lines. No torch."""

from __future__ import annotations

import textwrap
from typing import Any

from probes.analysis.fit import FRESH, GUARD, INTERRUPTED, OK, OOM, OVER
from probes.records.names import counter_name
from probes.tools.units import format_bytes, format_duration

WIDTH = 80


def _wrap(text: str, first: str = "", rest: str = "") -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=rest) or [""]


def _pct(x: float | None, sign: bool = True) -> str:
    if x is None:
        return "n/a"
    return f"{x:+.1%}" if sign else f"{x:.1%}"


def headline(doc: dict[str, Any]) -> str | None:
    """`fits B ≤ 166, T ≤ 256 (±2.1%)`-style summary of an answer, or None without one."""
    ans = doc.get("answer")
    if not ans:
        return None
    parts = []
    b, c = ans["batch"], ans["context"]
    if b.get("largest") is not None:
        parts.append(f"B ≤ {_size(b)}" if b["largest"] else "not even B=1")
    if c.get("largest") is not None:
        parts.append(f"T ≤ {_size(c)}" if c["largest"] else "not even T=1")
    if not parts:
        return None
    band = max(b.get("band") or 0.0, c.get("band") or 0.0, ans.get("band") or 0.0)
    return f"fits {', '.join(parts)} (±{band:.1%})"


def _size(entry: dict[str, Any]) -> str:
    """The largest size, or its range where the band is over 5%."""
    if entry.get("range") and entry.get("low") is not None and entry.get("high") is not None \
            and entry["low"] != entry["high"]:
        return f"{entry['low']}–{entry['high']}"
    return str(entry["largest"])


def fit_lines(doc: dict[str, Any]) -> list[str]:
    """The whole screen."""
    lines = [_title(doc), _budget(doc), *_wrap(
        f"peak = {doc.get('peak_source') or doc.get('peak_name', 'peak')}, per step; "
        f"{doc.get('counter_peak_name', 'counter peak')} beside it")]
    lines += _points(doc)
    fit = doc.get("fit")
    if fit is None:
        lines += _no_fit(doc)
        return lines + _state(doc)
    lines += _wrap(_fit_line(doc), "", "  ")
    if fit.get("poor"):
        lines += _wrap(f"the fit is poor (residuals, step-to-step spread and run to run: "
                       f"±{fit['band']:.1%}, over 5%): ranges below, not one number")
    if fit.get("per_doubling"):
        lines += _wrap(f"past the probe the band grows {fit['per_doubling']:.1%} per doubling "
                       "of B·T (the largest point predicted from the others was "
                       f"{fit['extrapolation_error']:+.1%} off); over 5%: a range")
    for r in fit.get("fresh") or []:
        lines += _wrap(f"run to run: a fresh process at B={r['batch_size']} T={r['seq_len']} "
                       f"measured {format_bytes(r['measured_bytes'])}, {r['error']:+.1%} "
                       "from the prediction (in the band)")
    if fit.get("rest_drift_bytes", 0) > 0.01 * (doc["points"][0].get("peak_bytes") or 1):
        lines += _wrap(f"the rest level grew {format_bytes(fit['rest_drift_bytes'])} over "
                       "the probe (kernels cached per shape): the table predicts each point "
                       "on its own rest level, the answers below on the first point's, as a "
                       "fresh run holds one shape's caches")
    lines += _answer(doc)
    lines += _verification(doc)
    return lines + _state(doc)


def _title(doc: dict[str, Any]) -> str:
    params = doc.get("params")
    return (f"memtop fit  {doc.get('device')} · amp {doc.get('amp')} · "
            f"{doc.get('attention')} attention · "
            + (f"{params:,} params" if isinstance(params, int) else "? params"))[:WIDTH]


def _budget(doc: dict[str, Any]) -> str:
    budget, head = doc.get("budget_bytes"), doc.get("headroom_pct") or 0.0
    limit = int((budget or 0) * (1 - head / 100))
    return (f"budget {format_bytes(budget)} ({doc.get('budget_source')}), headroom "
            f"{head:g}%: the sizes below stay under {format_bytes(limit)}")


def _points(doc: dict[str, Any]) -> list[str]:
    fit = doc.get("fit") or {}
    residuals = iter(fit.get("residuals", []))  # one per fitted point, in order
    fresh = iter(fit.get("fresh", []))  # the fresh process's, against the prediction
    pts = doc.get("points", [])
    steps = next((p.get("steps") for p in pts if p.get("steps")), None)
    secs = sum(p.get("seconds") or 0.0 for p in pts)
    out = [f"probe: {sum(1 for p in pts if p.get('status') == OK)} of {len(pts)} points, "
           f"{steps or '?'} steps each, {format_duration(secs)}", "",
           f"{'B':>6} {'T':>6} {'peak':>10} {'predicted':>10} {'residual':>9} "
           f"{counter_name('peak', str(doc.get('device') or 'cpu')):>10} {'predicted':>10}"]
    for p in pts:
        b, t = p["batch_size"], p["seq_len"]
        if p.get("status") != OK:
            peak = f" {format_bytes(p['peak_bytes']):>10}" if p.get("peak_bytes") else ""
            said = OVER if peak and p["status"] == OVER else status_text(p)  # the peak says it
            out.append(f"{b:>6} {t:>6}{peak}  {said}"[:WIDTH])
            continue
        is_fresh = p.get("role") == FRESH
        r = next(fresh if is_fresh else residuals, None) if fit else None
        out.append(f"{b:>6} {t:>6} {format_bytes(p.get('peak_bytes')):>10} "
                   f"{format_bytes(r and r['predicted_bytes']):>10} "
                   f"{_pct(r and r['error' if is_fresh else 'peak']):>9} "
                   f"{format_bytes(p.get('counter_peak_bytes')):>10} "
                   f"{format_bytes(r and r['counter_predicted_bytes']):>10}"
                   + ("  fresh" if is_fresh else ""))
    return out + [""]


def status_text(p: dict[str, Any]) -> str:
    """"over budget: its measured peak is over the budget", "interrupted (SIGINT)": a
    reason that starts with its status is not said twice."""
    status, why = str(p.get("status")), str(p.get("reason") or "")
    if why.startswith(status):
        return why
    return f"{status}: {why}" if why else status


def nothing_fits(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The smallest probe point, where it did not fit the budget (measured over it, stopped
    by the guard, out of memory) and no point did: the budget holds nothing this model
    runs. None otherwise."""
    points = doc.get("points") or []
    if doc.get("answer") or any(p.get("status") == OK for p in points):
        return None
    return next((p for p in points if p.get("status") in (OVER, GUARD, OOM)), None)


def _no_fit(doc: dict[str, Any]) -> list[str]:
    return _wrap(no_fit_text(doc))


def no_fit_text(doc: dict[str, Any]) -> str:
    """Why there is no fit; where the budget is why (the smallest point measured over it, or
    out of memory), the answer itself: nothing fits, and what the smallest size needs."""
    stopped = nothing_fits(doc)
    if stopped is None:
        pts = doc.get("points") or []
        ran = [p for p in pts if p.get("status") == OK]
        over = next((p for p in pts if p.get("status") in (OVER, GUARD, OOM)), None)
        why = f"no fit: {doc.get('fit_error') or 'no points measured'}"
        if ran and over:
            why += (f"; the budget stopped the probe: B={ran[-1]['batch_size']} "
                    f"T={ran[-1]['seq_len']} ran under it, B={over['batch_size']} "
                    f"T={over['seq_len']} did not")
        return why
    b, t = stopped["batch_size"], stopped["seq_len"]
    needs = (f"needs {format_bytes(stopped['peak_bytes'])}" if stopped.get("peak_bytes")
             else f"{status_text(stopped)}")
    held = doc.get("held_bytes")
    with_torch = (f" (the process with torch and the model holds ~{format_bytes(held)} "
                  "before a step)" if held else "")
    return (f"nothing fits {format_bytes(doc.get('budget_bytes'))}: B={b} T={t}, the "
            f"smallest point, {needs}{with_torch}")


def _fit_line(doc: dict[str, Any]) -> str:
    fit = doc["fit"]
    rest = sum(p["bytes"] for p in fit["parts"] if "bytes" in p)
    coef = [sum(p["coef"][i] for p in fit["parts"] if "coef" in p) for i in
            range(len(fit["features"]))]
    text = f"fit: {format_bytes(rest + coef[0])} + {format_bytes(coef[1])} per B·T"
    if len(coef) > 2:
        text += f" + {coef[2]:.0f} B per B·T² (T×T scores)"
    return f"{text}; band ±{fit['band']:.1%}"


def _answer(doc: dict[str, Any]) -> list[str]:
    ans = doc.get("answer")
    if not ans:
        return [f"no answer: {doc.get('fit_error')}"] if doc.get("fit_error") else []
    out = [""]
    b, c = ans["batch"], ans["context"]
    counter = doc.get("counter_peak_name", "counter")
    if b.get("largest") is None:
        out += _wrap(f"largest B: none found ({b.get('why')})")
    elif b["largest"] == 0:
        out += _wrap(f"largest B at T={b['seq_len']}: none fits ({b.get('why')})")
    else:
        out += _wrap(f"largest B at T={b['seq_len']}: {_size(b)}  predicted peak "
                     f"{format_bytes(b.get('peak_bytes'))} ±{b['band']:.1%} ({counter} "
                     f"{format_bytes(b.get('counter_peak_bytes'))})", "", "  ")
    if c.get("largest") is None:
        out += _wrap(f"largest T: none found ({c.get('why')})")
    elif c["largest"] == 0:
        out += _wrap(f"largest T at B={c['batch_size']}: none fits ({c.get('why')})")
    else:
        out += _wrap(f"largest T at B={c['batch_size']}: {_size(c)}  predicted peak "
                     f"{format_bytes(c.get('peak_bytes'))} ±{c['band']:.1%} ({counter} "
                     f"{format_bytes(c.get('counter_peak_bytes'))})", "", "  ")
        if c.get("capped_by_context"):
            out += _wrap(f"the model's context ends there (--block-size {c['max_seq_len']}); "
                         f"memory allows ~{c.get('memory_allows')}", "  ", "  ")
    today = ans["today"]
    out.append(f"today (B={today['batch_size']}, T={today['seq_len']}): predicted peak "
               f"{format_bytes(today['peak_bytes'])}, "
               + ("fits" if today["fits"] else "OVER the limit"))
    if ans.get("moves"):
        at_b = b.get("largest") or today["batch_size"]
        out.append(f"moves the limit most (shares of the peak at B={at_b}, "
                   f"T={b['seq_len']}):")
        for m in ans["moves"]:
            out += _wrap(f"{m['part']} {m['share']:.0%}: {m['advice']}", "  ", "    ")
            if m.get("scores_share"):
                out += _wrap(f"of which T×T scores {m['scores_share']:.0%}: "
                             f"{m['scores_advice']}", "    ", "      ")
    return out


def _verification(doc: dict[str, Any]) -> list[str]:
    rows = doc.get("verification") or []
    if not rows:
        return []
    out = ["", "verify (each in a fresh process, the budget as its --max-memory):"]
    for r in rows:
        where = f"(B={r['batch_size']}, T={r['seq_len']})"
        budget = doc.get("budget_bytes") or 0
        seen = r.get("measured_bytes")
        if r.get("verdict") == "not checked" or r.get("status") == INTERRUPTED:
            out += _wrap(f"{r['what']} {where}: not checked: interrupted", "  ", "    ")
            continue
        mark = {"agrees": "agrees", "outside the band":
                f"under the budget, outside the band ±{r.get('band') or 0:.1%}"}.get(
            r.get("verdict") or ("agrees" if r["agrees"] else ""), "DISAGREES")
        if r["status"] == OK:
            what = (f"measured {format_bytes(seen)}, predicted "
                    f"{format_bytes(r['predicted_bytes'])} ({_pct(r['error'])})")
            limit = (doc.get("answer") or {}).get("limit_bytes")
            if seen and seen > budget:
                what += f", over the budget {format_bytes(budget)}"
            elif seen and limit and seen > limit:  # the headroom is for later in a run
                what += f", over the {format_bytes(limit)} headroom line"
        elif r["status"] == GUARD:
            what = (f"stopped by the memory guard at {r.get('guard_counter') or 'memory'} "
                    f"{format_bytes(seen)}, " + (
                        "over the budget" if seen and seen > budget
                        else "its next step would pass the budget"))
        elif r["status"] == OVER and seen:
            what = f"measured {format_bytes(seen)}, over the budget {format_bytes(budget)}"
        else:
            what = status_text(r)
        out += _wrap(f"{r['what']} {where}: {what}: {mark}", "  ", "    ")
    return out


def _state(doc: dict[str, Any]) -> list[str]:
    state = doc.get("state")
    if state == "interrupted" and doc.get("fit") is None:
        return ["", "interrupted: too few points were measured before the stop for a fit"]
    if state == "interrupted":
        return ["", "interrupted: the fit above is from the points measured before the stop"]
    if state == "failed":
        return ["", f"the probe failed: {doc.get('error') or 'see metrics.jsonl'}"]
    return []
