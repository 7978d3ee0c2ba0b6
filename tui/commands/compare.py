"""``memtop compare RUN_A RUN_B [RUN...]``: runs side by side against the first (the baseline),
with the config diff, speed with its noise, peaks, skipped steps, loss curves and, when the
precision differs, the tutorial's §6.2 check. Writes compare.md and compare.json.

Exit status: 0 compared; 1 a --fail-if-* gate failed (for CI); 2 bad input (one line).
"""

from __future__ import annotations

import argparse
import sys

from tui.commands.argtypes import UsageError
from tui.output import say_all

EXIT_GATE = 1


def _pct(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be zero or more")
    return value


def add_parser(sub: argparse._SubParsersAction) -> None:
    from probes.analysis.compare.windows import DEFAULT_LOSS_TOLERANCE

    p = sub.add_parser("compare", help="compare runs against a baseline: speed, peaks, loss",
                       description="Compare run folders against the first one (the baseline): "
                                   "what changed, tokens/s and step time with their noise, "
                                   "peaks, skipped steps and the loss curves; with a precision "
                                   "change, whether the loss still agrees. Writes compare.md "
                                   "and compare.json.")
    p.add_argument("runs", metavar="RUN", nargs="+",
                   help="run folders; the first is the baseline (at least two)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="where compare.md/json go (default: the last run's folder)")
    p.add_argument("--fail-if-slower", type=_pct, metavar="PCT", default=None,
                   help="exit 1 when a run is measurably slower than the baseline by more "
                        "than PCT %%")
    p.add_argument("--fail-if-bigger", type=_pct, metavar="PCT", default=None,
                   help="exit 1 when a run's peak allocated is more than PCT %% above the "
                        "baseline's")
    p.add_argument("--loss-tolerance", type=_pct, metavar="PCT",
                   default=DEFAULT_LOSS_TOLERANCE * 100,
                   help="relative gap of the 10-step mean losses still called agreement")
    p.add_argument("--force", action="store_true",
                   help="compare runs of different models (layers, heads, dim)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from probes.analysis.compare.compare import compare_runs, gate
    from probes.analysis.compare.text import render_markdown
    from probes.runfolder import RunFolderError, is_run_folder, resolve_run, write_json, write_text
    from tui.charts import loss_chart

    if len(args.runs) < 2:
        raise UsageError("memtop compare: give at least two run folders (the first is the "
                         "baseline)")
    try:
        runs = []
        for given in args.runs:  # a folder of runs means its newest run, as in `memtop view`
            picked = resolve_run(given)
            if not is_run_folder(Path(given)):
                print(f"memtop compare: {given} is a folder of runs; comparing its newest, "
                      f"{picked}", file=sys.stderr)
            runs.append(str(picked))
        result = compare_runs(runs, force=args.force,
                              tolerance=args.loss_tolerance / 100)
    except RunFolderError as exc:
        raise UsageError(f"memtop compare: {exc}") from None
    out_dir = Path(args.out) if args.out else Path(runs[-1])
    curves = result["loss_curves"]
    md = render_markdown(result, [("Loss curves", loss_chart(curves))])
    failures = gate(result, args.fail_if_slower, args.fail_if_bigger)
    result["gate"] = {"fail_if_slower": args.fail_if_slower,
                      "fail_if_bigger": args.fail_if_bigger, "failures": failures}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json(out_dir / "compare.json", result)
        write_text(out_dir / "compare.md", md)
    except OSError as exc:
        raise UsageError(f"memtop compare: cannot write into {out_dir}: "
                         f"{exc.strerror or exc}") from None
    color = sys.stdout.isatty()
    terminal = render_markdown(result, [("Loss curves", loss_chart(curves, color=color))])
    say_all(terminal + f"memtop: wrote {out_dir / 'compare.md'} and compare.json\n")
    for line in failures:
        print(f"memtop compare: FAIL: {line}", file=sys.stderr)
    return EXIT_GATE if failures else 0

