"""Which keys a dashboard offers: the same app trains (`memtop train`), watches another
process's run (`memtop view`, q leaves it running), or shows a run that has ended (nothing
left to steer). One table for the footer and the help screen, so neither offers a key that
does nothing."""

from __future__ import annotations

from typing import Any

TRAIN, VIEW, ENDED = "train", "view", "ended"
# actions that need a live run (its training thread acts on them at a step boundary)
STEERING = ("profile", "attribute", "leak", "pause", "resume", "stop_run", "who_holds",
            "snapshot")
STEERING_KEYS = ("p", "a", "l", "space", "w", "m")  # their keys in the help's lines
VIEW_QUIT = "leave the viewer; the run goes on (x stops it)"
VIEW_STOP = ("x", "stop the run itself at its next step boundary (asks first)")
ENDED_QUIT = ("quit (the run has ended: nothing to profile, attribute, leak, pause or look "
              "into)")


def key_role(app: Any) -> str:
    """TRAIN, VIEW or ENDED for a MemtopApp (ENDED wins: a finished run steers nothing)."""
    state = app.run_state
    if state.finished or state.state == "failed":
        return ENDED
    if app.ending is None and not app.source.in_process:
        return VIEW
    return TRAIN


def action_shown(action: str, role: str, paused: bool = False) -> bool:
    """Whether the footer shows (and the app runs) ``action`` in ``role``; ``paused``: the
    run is paused or about to be (space then says "resume", not "pause")."""
    if role == ENDED:
        return action not in STEERING
    if action in ("pause", "resume"):
        return (action == "resume") == paused
    if action == "stop_run":
        return role == VIEW
    return True


def keys_for(keys: tuple[tuple[str, str], ...], role: str) -> tuple[tuple[str, str], ...]:
    """The help's key lines for ``role``, from the training dashboard's ``keys``."""
    out: list[tuple[str, str]] = []
    for key, text in keys:
        if role == ENDED and key in STEERING_KEYS:
            continue
        if key == "q":
            if role == VIEW:
                out += [(key, VIEW_QUIT), VIEW_STOP]
                continue
            if role == ENDED:
                text = ENDED_QUIT
        out.append((key, text))
    return tuple(out)
