"""memtop's exit statuses, one definition for every command and every rank, so a CI job can
tell a guard stop or a failed run from a finished one (README, "When things go wrong")."""

from __future__ import annotations

from typing import Any

EXIT_OK = 0  # finished its steps, or stopped on request (a viewer's x, q, --steps reached)
EXIT_FAILED = 1  # the training or inference itself failed (an error row is in metrics.jsonl)
EXIT_USAGE = 2  # bad input: one line on stderr, nothing run
EXIT_MEMORY_GUARD = 3  # --max-memory stopped the run before the limit (or it was already over)
EXIT_SIGHUP = 129  # the terminal went away (128 + SIGHUP); every finished step is kept
EXIT_SIGINT = 130  # Ctrl-C (128 + SIGINT); every finished step is kept
EXIT_SIGTERM = 143  # SIGTERM (128 + SIGTERM); every finished step is kept


def run_exit_code(state: Any, failed: bool = False) -> int:
    """A run's status from its folded records (probes/runfolder/state.py RunState)."""
    if failed or state.state == "failed":
        return EXIT_FAILED
    return EXIT_MEMORY_GUARD if state.guard_tripped else EXIT_OK
