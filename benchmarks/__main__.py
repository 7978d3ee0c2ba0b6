"""`python -m benchmarks`: the one entry point to memtop's benchmarks.

    python -m benchmarks list                      # every case: what it measures, its target
    python -m benchmarks run NAME [options]        # one case (NAME --help: its options)
    python -m benchmarks record-gpu SUMMARY.json   # a GPU run's claims into RESULTS.md's rows

The GPU check is its own command: python -m benchmarks.gpu.check OUT (or, on the lent machine,
bash benchmarks/gpu/run.sh); benchmarks/README.md says how each part fits.
"""

from __future__ import annotations

import os
import sys
import textwrap

USAGE = "usage: python -m benchmarks {list,run NAME [options],record-gpu SUMMARY [options]}"


def list_cases() -> int:
    from benchmarks.cases import all_cases

    area = None
    for case in all_cases():
        if case.area != area:
            area = case.area
            print(f"\n{area}/")
        print(f"  {case.name:20} {case.time_here}")
        for line in textwrap.wrap(f"measures: {case.measures}", 96, break_on_hyphens=False):
            print(f"      {line}")
        print(f"      target: {case.target}")
    print("\nGPU claims: python -m benchmarks.gpu.check OUT --dry-run lists them "
          "(benchmarks/gpu/claims/)")
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() if argv else USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command.lower() == "list":
        return list_cases()
    if command == "run":
        from benchmarks.cases import find
        from benchmarks.harness.cli import run

        if not rest or rest[0].startswith("-"):
            print("python -m benchmarks run: name a case (python -m benchmarks list)",
                  file=sys.stderr)
            return 2
        try:
            case = find(rest[0])
        except KeyError as exc:
            print(f"python -m benchmarks run: {exc.args[0]}", file=sys.stderr)
            return 2
        return run(case, rest[1:])
    if command == "record-gpu":
        from benchmarks.gpu.record import main as record_gpu

        return record_gpu(rest)
    print(f"python -m benchmarks: unknown command {command!r} ({USAGE[7:]})", file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:  # `list | head`: the reader went away, nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
