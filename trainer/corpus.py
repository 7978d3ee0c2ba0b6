"""The training text shipped inside the package, as raw bytes (vocab 256). No torch here, so the
CLI can validate --seq-len against it without importing torch (trainer/data.py makes tensors)."""

from __future__ import annotations

from functools import cache
from importlib import resources

TEXT_NAME = "sonnets.txt"


@cache
def corpus_raw() -> bytes:
    """The shipped text (public domain); nothing is downloaded."""
    return resources.files("trainer").joinpath("data", TEXT_NAME).read_bytes()


def corpus_bytes() -> int:
    """Length of the shipped text in tokens (bytes), for validating --seq-len up front."""
    return len(corpus_raw())
