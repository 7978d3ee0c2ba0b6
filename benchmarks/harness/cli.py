"""One entry point for every case: ``python -m benchmarks run NAME [options]``.

A case is a module of benchmarks/cases/<area>/ with ``options(parser)`` (the options it adds)
and ``main(args)`` (it measures and publishes), declared once in benchmarks/cases' ``CASES`` as
a ``Case``: its name, what it measures, its target and how long it takes here. ``run`` builds the
case's parser (its --help: what it measures, the target, the module's docstring), adds the
options every case shares (--no-append; --pairs, --max-busy, --max-wait, --amp, --smoke where
the case asks for them), parses, records the command that reproduces the run and calls main.
Bad input: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import shlex
import sys
import textwrap
from collections.abc import Sequence
from types import ModuleType


class BadInput(ValueError):
    """A case's own check of its options failed: one line on stderr, exit 2."""


@dataclasses.dataclass(frozen=True)
class Case:
    name: str  # what `python -m benchmarks run` takes
    area: str  # its folder under benchmarks/cases/
    measures: str
    target: str
    time_here: str  # with the defaults, on this project's 2-core machines
    module: str = ""  # the module in its area, when not the case's name

    def import_module(self) -> ModuleType:
        return importlib.import_module(f"benchmarks.cases.{self.area}.{self.module or self.name}")


class CaseParser(argparse.ArgumentParser):
    """The case's parser: bad input is one line on stderr and exit 2; the shared options."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message}\n")

    def pairs(self, default: int, what: str = "A, B, A'") -> None:
        self.add_argument("--pairs", type=int, default=default,
                          help=f"rounds of [{what}] (odd rounds reversed; A/A from the same "
                               "round); fewer than 7 are printed, not judged")

    def quiet(self, max_wait: float = 600.0) -> None:
        self.add_argument("--max-busy", type=float, default=0.3,
                          help="wait until fewer cores than this are busy; runs where other "
                               "processes used more are marked as measured under load")
        self.add_argument("--max-wait", type=float, default=max_wait,
                          help="seconds to wait for idle cores before measuring anyway")

    def amp(self, choices: Sequence[str] = ("auto", "off", "bf16"), default: str = "auto") -> None:
        self.add_argument("--amp", choices=tuple(choices), default=default,
                          help="off on a CPU without native bf16, where bf16 is ~16× slower")

    def smoke(self, what: str = "tiny model") -> None:
        self.add_argument("--smoke", action="store_true",
                          help=f"{what}: checks the case works, its figures mean nothing "
                               "(nothing appended)")

    def verbose(self) -> None:
        self.add_argument("--verbose", action="store_true", help="print every side's figure")


def parser_for(case: Case, module: ModuleType) -> CaseParser:
    """--help: the module's first paragraph, what the case measures and its target (as `list`
    gives them), the options, then the rest of the module's docstring."""
    first, _, rest = (module.__doc__ or "").strip().partition("\n\n")
    said = (("Measures", case.measures), ("Target", case.target),
            ("Time here", f"{case.time_here} (benchmarks/cases/{case.area}/)"))
    lines = [textwrap.fill(f"{k}: {v}", 96, subsequent_indent="  ", break_on_hyphens=False)
             for k, v in said]
    ap = CaseParser(prog=f"python -m benchmarks run {case.name}",
                    formatter_class=argparse.RawDescriptionHelpFormatter,
                    description=first + "\n\n" + "\n".join(lines),
                    epilog=rest.strip() or None)
    if getattr(module, "PUBLISHES", True):
        ap.add_argument("--no-append", action="store_true",
                        help="print only: no row of RESULTS.md, no dated log")
    module.options(ap)
    return ap


def run(case: Case, argv: Sequence[str]) -> int:
    """Parse ``argv`` for ``case`` and run it; its exit status."""
    module = case.import_module()
    ap = parser_for(case, module)
    args = ap.parse_args(list(argv))
    args.command = " ".join(["python -m benchmarks run", case.name, *map(shlex.quote, argv)])
    args.case = case
    try:
        code = module.main(args)
    except BadInput as exc:
        print(f"{ap.prog}: {exc}", file=sys.stderr)
        return 2
    return int(code or 0)
