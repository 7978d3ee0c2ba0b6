"""Several ranks acting on one request together, with no collective added to their steps: they
agree on a future step by asking each rank's socket where it is (docs/ARCHITECTURE.md, "Beyond one
training process")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from probes.control.unix_socket import NotLive
from probes.control.unix_socket import request as send_request
from probes.runfolder import socket_name

STEP_LEAD_S = 1.0  # a request for several ranks is for the step about this far ahead


def agree_step(run_dir: Path, ranks: Sequence[int | None], step_ms: float | None = None,
               lead_s: float = STEP_LEAD_S) -> tuple[int | None, str | None]:
    """A step that every rank can still act before, so they all act together with no
    collective added to their steps: the furthest rank's step (asked through each socket)
    plus about ``lead_s`` of steps, at least 3, at the fastest step time known (the caller's or
    a rank's own, from its ping: a viewer that has read no row yet once gave 3 steps, ~30 ms on
    a tiny model, and one rank started its window a step late). A rank at step s has already
    done the boundary before s + 1, and DDP keeps ranks within a step of each other.

    Returns (step, None); (None, None) when every rank waits paused at the same boundary (act
    there, at once); (None, why) when a rank cannot be reached.
    """
    steps, paused = [], []
    for rank in ranks:
        try:
            answer = send_request(Path(run_dir) / socket_name(rank), {"request": "ping"},
                                  timeout_s=1.0)
        except NotLive as exc:
            return None, f"rank {rank}: {exc.strerror or exc}"
        if not answer.get("ok"):
            return None, f"rank {rank}: {answer.get('error')}"
        steps.append(int(answer.get("step") or 0))
        paused.append(bool(answer.get("paused")))
        own_ms = answer.get("step_ms")  # the rank's last step, fresher than the caller's
        if isinstance(own_ms, (int, float)) and own_ms > 0:
            step_ms = min(step_ms, own_ms) if step_ms else float(own_ms)
    if not steps:
        return None, "no rank to ask"
    if all(paused) and len(set(steps)) == 1:
        return None, None
    lead = 3
    if step_ms and step_ms > 0:
        lead = max(3, math.ceil(lead_s * 1000.0 / step_ms))
    return max(steps) + lead, None
