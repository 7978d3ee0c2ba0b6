"""One module per `memtop` subcommand. Each has ``add_parser(subparsers)`` and ``run(args)``.

Modules import only what parsing needs at the top (no torch, no Textual), so ``memtop --help``
and bad-input errors answer at once; the heavy imports happen inside ``run``.
"""

from __future__ import annotations

# Listed in the order `memtop --help` shows them.
COMMANDS = ("train", "infer", "view", "runs", "report", "compare", "sweep", "fit", "snapshot",
            "metrics")
