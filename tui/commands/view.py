"""``memtop view [RUN]``: the dashboard over a run folder — live from another process (a headless
job, your own loop with probes.Monitor, several ranks) or finished.

Keys steer a live run through its socket (docs/ARCHITECTURE.md, "Talking back"); `q` leaves the
viewer and the run goes on.
"""

from __future__ import annotations

import argparse
import sys

from tui.commands.argtypes import UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("view", help="open the dashboard on a run folder, live or finished",
                       description="Open the dashboard on a run folder. A run still writing is "
                                   "followed, and p, l, space, r steer it through its socket; "
                                   "q leaves the viewer and the run goes on; x stops the run "
                                   "after a confirmation.")
    p.add_argument("run", metavar="RUN", nargs="?", default="runs",
                   help="a run folder, or a folder of runs (its newest run is opened) "
                        "(default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    from probes.runfolder import RunFolderError, resolve_run

    try:
        run_dir = resolve_run(args.run)
    except RunFolderError as exc:
        raise UsageError(f"memtop view: {exc}") from None
    if not (sys.stdin.isatty() and sys.stdout.isatty() and sys.stderr.isatty()):
        raise UsageError("memtop view: no terminal here (stdin, stdout or stderr is not a TTY); "
                         f"use `memtop report {run_dir}` for a text summary")
    from tui.app import MemtopApp
    from tui.dashboard_run import quit_on_signals, terminal_detacher, terminal_restorer
    from tui.exit_guard import ExitGuard
    from tui.output import say

    try:
        app = MemtopApp.for_folder(run_dir)
    except RunFolderError as exc:
        raise UsageError(f"memtop view: {exc}") from None
    stdin = sys.__stdin__.fileno()
    guard = ExitGuard(lambda signum, _reason: app.signal_quit(signum),  # the run goes on
                      restore=terminal_restorer(stdin), detach=terminal_detacher(stdin))
    with quit_on_signals(guard):
        try:
            app.run()
        finally:
            app.shutdown(1.0, out=sys.stdout)
    live = app.source.live
    say(sys.stdout, f"memtop: run folder {run_dir}" + (" (still running)" if live else ""))
    if guard.armed:
        return guard.exit_code()
    return app.return_code if app.return_code is not None else app.exit_code()
