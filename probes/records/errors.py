"""memtop's own error types: one base class, so a caller can catch everything memtop raises
about its use, and each message is one sentence naming what to change."""

from __future__ import annotations


class MemtopError(Exception):
    """Base of every error memtop raises about how it is used."""


class MonitorArgumentError(MemtopError, ValueError):
    """A Monitor was given something it cannot watch (e.g. an optimizer of another model)."""


class MonitorStateError(MemtopError, RuntimeError):
    """A Monitor was used out of order (e.g. a step after close(), or steps nested)."""


class NonFiniteError(RuntimeError):
    """Loss or gradient norm became inf/nan with no GradScaler to skip the step (raised by a
    Monitor made with ``non_finite="fail"``)."""
