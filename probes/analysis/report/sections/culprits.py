"""Who holds the memory: each answer of the culprit finder (a ``leak_culprit`` event, at a
leak alert or on the `w` key), its culprits as the sentences the dashboard shows. The leak
section's hints are guesses from the growth rate; this section is what was found alive."""

from __future__ import annotations

from typing import Any

from probes import records as R
from probes.analysis.report.context import ReportContext, shown_fields
from probes.records import incomplete
from probes.records.culprits import culprit_line, culprit_summary

TRIGGERS = {R.LEAK_SUSPECTED: "at the leak alert", "request": "asked for (w key or a viewer)"}


def build(ctx: ReportContext) -> dict[str, Any] | None:
    found = [shown_fields(e) for e in ctx.metrics.named(R.LEAK_CULPRIT)]
    return {"culprits": found} if found else None


def render(section: dict[str, Any], report: dict[str, Any]) -> list[str]:
    md = ["## Who holds the memory", "",
          "What the culprit finder saw alive at two looks a few steps apart, and what keeps "
          "it (the leak events' hints above are guesses from the growth rate).", ""]
    for e in section["culprits"]:
        how = TRIGGERS.get(str(e.get("trigger")), str(e.get("trigger") or "?"))
        took = e.get("look_s")
        scanned = e.get("objects_scanned")
        md.append(f"### Step {e.get('step')}, {how}"
                  + (f": over {e['steps']} steps" if e.get("steps") else "")
                  + (f", looks took {took:.2f} s" if isinstance(took, (int, float)) else "")
                  + (f", {scanned:,} objects scanned" if isinstance(scanned, int) else ""))
        md.append("")
        text = incomplete(R.LEAK_CULPRIT, e)
        culprits = [c for c in e.get("culprits") or [] if isinstance(c, dict)]
        if text is not None or e.get("error") or not culprits:
            md.append(text or culprit_summary(e))
        else:
            md += [f"- {culprit_line(c)}" for c in culprits]
        if e.get("note"):
            md += ["", f"Note: {e['note']}."]
        md.append("")
    return md
