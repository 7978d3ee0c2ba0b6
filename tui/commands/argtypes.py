"""Shared pieces of the command line: one-line usage errors and argument types."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

EXIT_USAGE = 2  # bad input: one line on stderr, this exit status, nothing written


class UsageError(Exception):
    """Bad input: printed as one line, exit 2."""


class HelpFormatter(argparse.HelpFormatter):
    """Real defaults shown (not None/False), and help that fits 80 columns on any terminal."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=30, width=80)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or action.default in (None, False, [], argparse.SUPPRESS) \
                or isinstance(action, argparse._StoreFalseAction):
            return text
        return text + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # argparse prints usage + message; we want one line
        raise UsageError(f"{self.prog}: {message}")


def int_arg(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def size_arg(text: str) -> int:
    from probes.tools.units import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def default_of(cls: type, name: str) -> Any:
    """The default of a config dataclass field: options take their defaults from there only."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    raise KeyError(name)
