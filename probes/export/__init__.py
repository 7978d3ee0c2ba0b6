"""Every run's counters for Prometheus: a ``/metrics`` endpoint over run folders (``memtop
metrics``) or over one process's own run (``Monitor(metrics_port=N)``, ``memtop train
--metrics-port N``). A reader: it follows run folders and never imports torch.

    from probes.export import FolderCollector, MetricsEndpoint

    endpoint = MetricsEndpoint(9464, bind="127.0.0.1")    # EndpointError: in use, bad address
    endpoint.serve(FolderCollector(["runs"], keep_s=300))  # a daemon thread answers scrapes
    print(endpoint.url)                                    # http://127.0.0.1:9464/metrics
    endpoint.close()

Modules: names (every metric's name, type and HELP, declared once), series (a rank's series
from its RunState; the metric families), follow (a run folder tailed), collector (the folder
and the in-process sources), server (the HTTP endpoint: /metrics only, TLS on request).
"""

from __future__ import annotations

from probes.export.collector import (
    DEFAULT_KEEP_S,
    FolderCollector,
    RecorderCollector,
)
from probes.export.follow import FollowedRun
from probes.export.names import LABELS, STATES, STEP_METRICS
from probes.export.series import RankSeries, families, rank_series
from probes.export.server import DEFAULT_BIND, EndpointError, MetricsEndpoint, check_port

__all__ = [
    "DEFAULT_KEEP_S", "FolderCollector", "RecorderCollector", "FollowedRun", "LABELS",
    "STATES", "STEP_METRICS", "RankSeries", "families", "rank_series", "DEFAULT_BIND",
    "EndpointError", "MetricsEndpoint", "check_port",
]
