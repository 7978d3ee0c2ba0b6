"""What every benchmark shares: the machine's description, the /proc readers, the loops
(interleaved pairs with their A/A noise, µs per call, units per second), the verdicts, the
results writer (RESULTS.md's rows and the dated logs), the command line of a case, the real
terminal (tmux) and `memtop train` as a measured process.

    from benchmarks.harness import Figure, publish, run_pairs

    def options(ap):                      # a case of benchmarks/cases/<area>/
        ap.pairs(7)
        ap.quiet()

    def main(args):
        pairs = run_pairs(args, "plain", {"plain": plain, "monitored": monitored})
        row, verdict = pairs.row("monitored", "monitored / plain, tokens/s", 0.99)
        publish(args, "Per-step cost", f"{RATIO_HEADER}\\n{row}\\n\\n{pairs.note()}",
                [pairs.figure("my_case/ratio", "monitored / plain", "monitored", 0.99)])

Modules: paths (ROOT, RESULTS, LOGS), machine, procfs, stats, pairs, results, cli (Case, the
parser, run), terminal (TmuxPane, memtop_argv), runs (`memtop train` headless or in a pane).
"""

from __future__ import annotations

import sys

if __name__ == "harness":  # imported by a flat script as `harness.runs` (benchmarks/ on sys.path)
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.harness.cli import BadInput, Case, CaseParser  # noqa: E402
from benchmarks.harness.machine import Machine, describe  # noqa: E402
from benchmarks.harness.pairs import (  # noqa: E402
    Pairs,
    in_thread,
    interleaved_pairs,
    per_call_us,
    run_pairs,
    units_per_s,
)
from benchmarks.harness.paths import LOGS, RESULTS, ROOT  # noqa: E402
from benchmarks.harness.procfs import (  # noqa: E402
    LoadMeter,
    busy_cores,
    cpu_busy_s,
    load_avg,
    load_note,
    own_cpu_s,
    proc_cpu_s,
    proc_rss_bytes,
    thread_cpu_s,
    top_cpu,
    wait_quiet,
)
from benchmarks.harness.results import Figure, publish, record  # noqa: E402
from benchmarks.harness.stats import (  # noqa: E402
    MIN_PAIRS,
    RATIO_HEADER,
    md_table,
    median,
    met,
    noise_band,
    pct,
    quartiles,
    ratio_row,
    ratio_value,
    spread,
    verdict,
)

__all__ = [
    "BadInput", "Case", "CaseParser", "Figure", "LOGS", "LoadMeter", "MIN_PAIRS", "Machine",
    "Pairs", "RATIO_HEADER", "RESULTS", "ROOT", "busy_cores", "cpu_busy_s", "describe",
    "in_thread", "interleaved_pairs", "load_avg", "load_note", "md_table", "median", "met",
    "noise_band", "own_cpu_s", "pct", "per_call_us", "proc_cpu_s", "proc_rss_bytes", "publish",
    "quartiles", "ratio_row", "ratio_value", "record", "run_pairs", "spread", "thread_cpu_s",
    "top_cpu", "units_per_s", "verdict", "wait_quiet",
]
