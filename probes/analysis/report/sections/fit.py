"""Will it fit? `memtop fit`'s answer, from the run folder's fit.json (probes/analysis/
fit_file.py): the same screen the command printed, the probe points, the fit and the
verification. A run without fit.json has no such section."""

from __future__ import annotations

from typing import Any

from probes.analysis.fit_file import read_fit
from probes.analysis.fit_text import fit_lines, headline
from probes.analysis.report.context import ReportContext
from probes.runfolder import RunFolderError


def build(ctx: ReportContext) -> dict[str, Any] | None:
    try:
        doc = read_fit(ctx.run_dir)
    except RunFolderError as exc:
        return {"fit": {"error": str(exc)}}
    if doc is None:
        return None
    return {"fit": {"state": doc.get("state"), "headline": headline(doc),
                    "budget_bytes": doc.get("budget_bytes"),
                    "budget_source": doc.get("budget_source"),
                    "headroom_pct": doc.get("headroom_pct"), "answer": doc.get("answer"),
                    "band": (doc.get("fit") or {}).get("band"),
                    "poor": (doc.get("fit") or {}).get("poor"),
                    "fit_error": doc.get("fit_error"),
                    "verification": doc.get("verification"),
                    "lines": fit_lines(doc)}}


def render(section: dict[str, Any], report: dict[str, Any]) -> list[str]:
    fit = section["fit"]
    md = ["## Will it fit?", ""]
    if fit.get("error"):
        return md + [f"fit.json could not be read: {fit['error']}", ""]
    if fit.get("headline"):
        md += [f"**{fit['headline']}** (fit.json; `memtop fit --verify` runs them)", ""]
    return md + ["```text", *fit["lines"], "```", ""]
