"""The report's sections, in the order report.md shows them, one list per kind of run.

Each section is a module with ``build(ctx) -> dict | None`` (the keys it adds to report.json,
from the run read once: probes/analysis/report/context.py; None when the run has no such
section) and ``render(section, report) -> list[str]`` (its lines of report.md, from what it
built and, where it refers to them, the other sections). A summary section (the finding) is
built after the others and reads what they built from ``ctx.built``.

    from probes.analysis.report.sections import SECTIONS
    for section in SECTIONS["train"]: ...

A new section is one module here, one line in SECTIONS and a test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from probes.analysis.report.context import ReportContext
from probes.analysis.report.sections import (
    attribution,
    baseline,
    culprits,
    finding,
    fit,
    header,
    infer_attribution,
    infer_finding,
    infer_results,
    infer_setup,
    leaks,
    ledger,
    profiles,
    ranks,
    results,
    setup,
    status,
    step_split,
)


@dataclass(frozen=True)
class Section:
    """How one section is built into report.json and rendered into report.md."""

    build: Callable[[ReportContext], dict[str, Any] | None]
    render: Callable[[dict[str, Any], dict[str, Any]], list[str]]
    summary: bool = False  # built after the other sections, from what they built


SECTIONS: dict[str, tuple[Section, ...]] = {
    "train": (
        Section(header.build_train, header.render_train),
        Section(finding.build, finding.render, summary=True),
        Section(fit.build, fit.render),
        Section(setup.build, setup.render),
        Section(results.build, results.render),
        Section(step_split.build, step_split.render),
        Section(ranks.build, ranks.render),
        Section(ledger.build, ledger.render),
        Section(attribution.build, attribution.render),
        Section(profiles.build, profiles.render),
        Section(leaks.build, leaks.render),
        Section(culprits.build, culprits.render),
        Section(baseline.build, baseline.render),
        Section(status.build, status.render),
    ),
    "fit": (  # `memtop fit`'s probe: several shapes, so no one B/T, timing or finding
        Section(header.build_train, header.render_train),
        Section(fit.build, fit.render),
        Section(setup.build, setup.render),
        Section(ledger.build, ledger.render),
        Section(status.build, status.render),
    ),
    "infer": (
        Section(header.build, header.render_infer),
        Section(infer_finding.build, finding.render, summary=True),
        Section(infer_setup.build, infer_setup.render),
        Section(infer_results.build, infer_results.render),
        Section(infer_attribution.build, infer_attribution.render),
        Section(profiles.build, profiles.render_by_phase),
        Section(status.build, status.render),
    ),
}

__all__ = ["SECTIONS", "Section"]
