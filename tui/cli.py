"""The ``memtop`` command. Subcommands live in tui/commands/, one module each.

Bad input never shows a traceback: one line on stderr and exit status 2, before anything runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

# Quiet torch's C++ loggers before torch is imported anywhere (profiler chatter on fd 2).
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
os.environ.setdefault("KINETO_LOG_LEVEL", "5")

from tui.commands import COMMANDS  # noqa: E402
from tui.commands.argtypes import EXIT_USAGE, Parser, UsageError  # noqa: E402


class _VersionAction(argparse.Action):
    """`memtop --version`, the version read only when asked (importlib.metadata costs ~30 ms
    at every start otherwise)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str = "show the version and exit"
                 ) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        from probes.counters.host import memtop_version

        print(f"memtop {memtop_version()}")  # on stdout, as argparse's own version action
        parser.exit()


def build_parser() -> Parser:
    parser = Parser(prog="memtop",
                    description="See where memory and time go while a PyTorch model trains.",
                    epilog="Run `memtop COMMAND --help` for a command's options.")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in COMMANDS:
        importlib.import_module(f"tui.commands.{name}").add_parser(sub)
    parser.commands = sub.choices  # name -> its parser, for errors said in its name
    return parser


def check_environment(command: str) -> None:
    """The variables memtop reads, checked before anything runs: a bad value is bad input."""
    from probes.counters.host import cpu_bf16_override

    try:
        cpu_bf16_override()
    except ValueError as exc:
        raise UsageError(f"memtop {command}: {exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args, extras = parser.parse_known_args(argv)
        if extras:  # said by the subcommand that was given, with a suggestion
            parser.commands.get(args.command, parser).unrecognized(extras)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        check_environment(args.command)
        return importlib.import_module(f"tui.commands.{args.command}").run(args)
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
