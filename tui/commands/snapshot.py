"""``memtop snapshot FILE.pickle``: what a CUDA memory snapshot holds, as text: reserved,
allocated and cached bytes, and the live allocations by line of the user's code.

The file is read without torch and without running anything in it (probes/traces/snapshot.py:
an Unpickler that refuses every class); a file that is not a snapshot, or asks for a class, is
one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from tui.commands.argtypes import EXIT_USAGE

TOP_SITES = 10


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("snapshot", help="read a CUDA memory snapshot (.pickle) as text",
                       description="Summarise a torch.cuda.memory._dump_snapshot() file (the "
                                   "m key's): segments, cached memory, and live allocations by "
                                   "line of your code. Nothing in the file is run.")
    p.add_argument("file", metavar="FILE.pickle", help="a memory snapshot")
    p.add_argument("--top", type=int, default=TOP_SITES, metavar="N",
                   help=f"allocation sites listed (default: {TOP_SITES})")


def snapshot_lines(summary: object, top: int = TOP_SITES) -> list[str]:
    """The summary as the lines the command prints (tested without a terminal)."""
    from probes.tools.units import format_bytes

    s = summary
    small = s.segments - s.large_segments
    lines = [f"reserved   {format_bytes(s.reserved_bytes)} in {s.segments} segments "
             f"({s.large_segments} large, {small} small)",
             f"allocated  {format_bytes(s.allocated_bytes)} in {s.active_blocks} blocks",
             f"cached     {format_bytes(s.free_bytes)} free in {s.inactive_blocks} blocks, "
             f"largest {format_bytes(s.largest_free_bytes)}",
             "expandable_segments "
             + ("n/a" if s.expandable_segments is None else str(s.expandable_segments).lower())]
    if not s.history_entries:
        lines.append("history    none (record it with --memory-history to see who allocated)")
        return lines
    actions = ", ".join(f"{k} {v}" for k, v in sorted(s.actions.items()))
    lines.append(f"history    {s.history_entries} entries ({actions})")
    lines.append("live allocations by line of your code:")
    for site in s.sites[:top]:
        lines.append(f"  {format_bytes(site.bytes):>10}  {site.blocks:>5} blocks  {site.where}")
    if len(s.sites) > top:
        lines.append(f"  ... {len(s.sites) - top} more sites")
    before = s.allocated_bytes - sum(site.bytes for site in s.sites)
    if before > 0:
        lines.append(f"  {format_bytes(before):>10}  allocated before the history began "
                     "(no stack recorded)")
    return lines


def run(args: argparse.Namespace) -> int:
    from probes.traces.snapshot import SnapshotError, load_snapshot, summarize

    if args.top < 1:
        print("memtop snapshot: --top must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    try:
        summary = summarize(load_snapshot(args.file))
    except SnapshotError as exc:
        print(f"memtop snapshot: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print("\n".join(snapshot_lines(summary, args.top)))
    return 0
