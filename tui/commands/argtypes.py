"""Shared pieces of the command line: one-line usage errors and argument types."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from trainer.exit_codes import EXIT_USAGE  # noqa: F401 (the commands' bad-input status)


class UsageError(Exception):
    """Bad input: printed as one line, exit 2."""


class HelpFormatter(argparse.HelpFormatter):
    """Real defaults shown (not None/False), and help that fits 80 columns on any terminal."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=30, width=80)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default.value if isinstance(action.default, Default) else action.default
        if "%(default)" in text or default in (None, False, [], argparse.SUPPRESS) \
                or isinstance(action, argparse._StoreFalseAction):
            return text
        return text + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.commands: dict[str, Parser] = {}  # the top-level parser's subcommands (tui/cli.py)

    def error(self, message: str) -> None:  # argparse prints usage + message; we want one line
        raise UsageError(f"{self.prog}: {message}")

    def unrecognized(self, extras: list[str]) -> None:
        """Options this (sub)command does not know, named with its own prog (`memtop train`)
        and the closest option it does know (a typo's likely fix)."""
        import difflib

        known = [s for a in self._actions for s in a.option_strings]
        hints = []
        for arg in extras:
            if arg.startswith("-"):
                close = difflib.get_close_matches(arg.split("=", 1)[0], known, n=1, cutoff=0.6)
                if close:
                    hints.append(f"did you mean {close[0]}?")
        self.error(f"unrecognized arguments: {' '.join(extras)}"
                   + (f" ({'; '.join(hints)})" if hints else ""))


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


class Default:
    """An option's default as argparse holds it: the config field's value, marked as not typed
    by the user, so the config can let it follow the options the user did type (issue 38 §3:
    ``--new-tokens 4`` alone makes the baseline 4 tokens, not an error about an option never
    typed). --help shows the value."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __str__(self) -> str:
        return str(self.value)

    def __repr__(self) -> str:
        return f"Default({self.value!r})"


def option_default(cls: type, name: str) -> Any:
    """argparse's default for an option of config field ``name``: ``Default(value)``, or None
    for a list (an append option: argparse appends to its default, so it must be a list or
    None; None is not typed either)."""
    value = default_of(cls, name)
    return None if isinstance(value, list) else Default(value)


def typed_options(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of config dataclass ``cls`` the user typed (an option parsed with
    ``option_default`` holds a Default, or None, until typed): what a config built by
    ``cls.from_options`` follows."""
    return {f.name: value for f in dataclasses.fields(cls)
            if (value := getattr(args, f.name, None)) is not None
            and not isinstance(value, Default)}
