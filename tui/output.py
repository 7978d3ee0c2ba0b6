"""Printing to the user's terminal: one line, or a whole text. Neither ends in a traceback when
the reader went away (a closed terminal, `| head`)."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TextIO


def say(out: TextIO | None, text: str) -> None:
    """One line for the user on the restored terminal; silent when it has hung up."""
    if out is not None:
        with contextlib.suppress(OSError, ValueError):
            print(text, file=out, flush=True)


def say_all(text: str) -> None:
    """Print to stdout; a reader that went away (`| head`) ends the output, not the command."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        quiet_stdout()


def quiet_stdout() -> None:
    """After a closed pipe, send stdout to /dev/null so the exit flush prints no traceback."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
