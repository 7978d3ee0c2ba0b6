"""How a run is steered: the one small thread-safe object that keys, a viewer's socket and the
launcher all submit requests to, the run's unix socket (mode 0600, never TCP), and several ranks
agreeing on the step to act at. No torch.

    from probes.control import RunControl, ControlServer, request

    control = RunControl()
    control.request_profile(source="keyboard")   # acted on at the next step boundary
    for req in control.take_due(step):           # the training thread, at a boundary
        ...
    answer = request(run_dir / "control.sock", {"request": "pause"})  # another process

Modules: requests (Request, RunControl), unix_socket (ControlServer, request, NotLive), ranks
(agree_step).
"""

from __future__ import annotations

from probes.control.ranks import STEP_LEAD_S, agree_step
from probes.control.requests import REQUESTS, Request, RunControl
from probes.control.unix_socket import (
    MAX_REQUEST_BYTES,
    ControlServer,
    NotLive,
    parse_request,
    request,
)

__all__ = [
    "STEP_LEAD_S", "agree_step", "REQUESTS", "Request", "RunControl", "MAX_REQUEST_BYTES",
    "ControlServer", "NotLive", "parse_request", "request",
]
