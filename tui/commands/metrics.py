"""``memtop metrics [DIR ...] --port N``: every run under the folders given, for Prometheus.

Serves ``/metrics`` (probes/export/) until Ctrl-C or SIGTERM. Runs are followed through their
run folders, so any writer (memtop train, a headless job, probes.Monitor, the HF and Lightning
callbacks, --nproc ranks) is exported without changing it.
"""

from __future__ import annotations

import argparse
import sys

from trainer.config import TrainConfig
from tui.commands.argtypes import UsageError, default_of, int_arg

DEFAULT_FOLDER = default_of(TrainConfig, "run_dir")  # where memtop train writes
DEFAULT_BIND = "127.0.0.1"  # probes/export/server.py's; not imported here (--help stays light)
# probes/export/collector.py's, checked equal by tests/unit/test_export_endpoint.py
DEFAULT_KEEP_S = 300


def seconds_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds ≥ 0")
    return value


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "metrics", help="serve every run's counters on /metrics for Prometheus",
        description="Serve /metrics for Prometheus: every run under the folders given, live "
                    "runs followed as they write, ended runs with their last values for "
                    "--keep seconds. New run folders appear without a restart. /metrics has "
                    "no authentication: it binds 127.0.0.1 unless --bind says otherwise "
                    "(reach it through an SSH tunnel or a reverse proxy; README, Many nodes).")
    p.add_argument("folders", metavar="DIR", nargs="*",
                   help=f"a folder of runs or a run folder (default: {DEFAULT_FOLDER})")
    p.add_argument("--port", type=int_arg, required=True, metavar="N",
                   help="TCP port to serve on; 0 = a free one (printed)")
    p.add_argument("--bind", default=DEFAULT_BIND, metavar="ADDR",
                   help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--keep", type=seconds_arg, default=DEFAULT_KEEP_S, metavar="SECONDS",
                   help="an ended run's last values stay this long after its last write")
    p.add_argument("--host-label", metavar="NAME",
                   help="the host label of every series (default: the host each run "
                        "recorded): for nodes whose hostnames are not unique")
    p.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate (PEM)")
    p.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    folders = args.folders or [DEFAULT_FOLDER]
    for folder in folders:
        path = Path(folder)
        if not path.is_dir():
            what = "is not a folder" if path.exists() else "does not exist"
            raise UsageError(f"memtop metrics: {path.resolve()} {what}; give a folder of runs "
                             "or a run folder")
    if args.host_label is not None and not args.host_label.strip():
        raise UsageError("memtop metrics: --host-label must not be empty")
    from probes.export import EndpointError, FolderCollector, MetricsEndpoint

    try:
        endpoint = MetricsEndpoint(args.port, args.bind, args.tls_cert, args.tls_key)
    except EndpointError as exc:
        raise UsageError(f"memtop metrics: {exc}") from None
    collector = FolderCollector(folders, keep_s=args.keep, host_label=args.host_label)
    endpoint.serve(collector)
    print(f"memtop metrics: serving {endpoint.url} for the runs under {', '.join(folders)} "
          "(Ctrl-C to stop)", flush=True)
    return wait_for_signal(endpoint)


def wait_for_signal(endpoint: object) -> int:
    """Serve until SIGINT or SIGTERM; then close the endpoint and exit 0."""
    import signal
    import threading

    done = threading.Event()

    def stop(_signum: int, _frame: object) -> None:
        done.set()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not done.wait(1.0):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        endpoint.close()  # type: ignore[attr-defined]
    print("memtop metrics: stopped", file=sys.stderr, flush=True)
    return 0
