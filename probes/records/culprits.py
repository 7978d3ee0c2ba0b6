"""The ``leak_culprit`` event's fields and the sentence each culprit reads as, in the user's
terms; the event kind (events.py), the dashboard's box and the report all use this text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from probes.tools.units import format_bytes

CULPRIT_FIELDS: dict[str, Any] = {
    "kind": "str", "holder": "str", "container": "str", "what": "str", "where": "str",
    "count": "int", "count_per_step": "num", "bytes": "int", "bytes_per_step": "num",
    "tensors": "int", "fix": "str"}
LEAK_CULPRIT_FIELDS: dict[str, Any] = {
    "trigger": "str", "first_step": "int", "steps": "int", "look_s": "num",
    "objects_scanned": "int", "gc_enabled": "bool", "guess": "str", "note": "str",
    "error": "str", "cuda_history_s": "num",
    "culprits": [CULPRIT_FIELDS]}

FIXES = {
    "graph": "keep loss.item() (or .detach()), not the tensor with its graph",
    "tensors": "keep .item() / .cpu() copies, or stop keeping them",
    "hooks": "register the hook once (or keep its handle and call .remove())",
    "host": "stop keeping what this line allocates each step",
    "cuda": "stop keeping what this line allocates on the device (or keep a .cpu() copy)",
    "gc": "call gc.enable() (or gc.collect() now and then), or break the cycle",
    "workers": "keep the dataset's data in numpy arrays, torch tensors or Arrow (not lists or "
               "dicts of Python objects), and keep no per-item cache in __getitem__",
}
NO_WALK = ("memtop cannot walk a worker's objects: they live in another process; it reads "
           "their memory from /proc only")


def _per_step(value: Any) -> str:
    return f"+{value:.3g}/step" if isinstance(value, (int, float)) else "+?/step"


def culprit_line(c: Mapping[str, Any]) -> str:
    """One culprit as a sentence: who, what, how fast, the fix."""
    kind = c.get("kind")
    graph = kind == "tensors" and "grad_fn=" in str(c.get("what"))
    fix = c.get("fix") or FIXES.get("graph" if graph else str(kind), "")
    tail = f" — {fix}" if fix else ""
    if kind == "hooks":
        return (f"hooks pile up: {c.get('holder')} has {c.get('count')} {c.get('what')} "
                f"({_per_step(c.get('count_per_step'))}), registered by {c.get('where')}{tail}")
    if kind == "host":
        return (f"host objects: {c.get('where')} keeps {format_bytes(c.get('bytes'))} in "
                f"{c.get('count')} blocks (+{format_bytes(c.get('bytes_per_step'))}/step){tail}")
    if kind == "cuda":
        return (f"device memory: {c.get('where')} allocated {format_bytes(c.get('bytes'))} in "
                f"{c.get('count')} blocks still alive (+{format_bytes(c.get('bytes_per_step'))}"
                f"/step){tail}")
    if kind == "workers":
        return (f"DataLoader workers: {c.get('count')} processes hold "
                f"{format_bytes(c.get('bytes'))} of their own (USS, "
                f"+{format_bytes(c.get('bytes_per_step'))}/step; {c.get('what') or 'growth'}); "
                f"{NO_WALK}{tail}")
    if kind == "gc":
        return (f"gc is off: {c.get('count')} unreachable objects (mostly {c.get('what')}) "
                f"hold {c.get('tensors')} tensors ({format_bytes(c.get('bytes'))}) that "
                f"gc.collect() would free{tail}")
    holder = c.get("holder") or "no named holder found"
    container = f"{c.get('container')} " if c.get("container") else ""
    graphs = " + their graphs" if graph else ""  # a graph's nodes are not tensors' bytes
    return (f"holder: {container}{holder} keeps {c.get('count')} tensors "
            f"({_per_step(c.get('count_per_step'))}, {format_bytes(c.get('bytes'))}{graphs}) "
            f"of {c.get('what')}{tail}")


def culprit_summary(d: Mapping[str, Any]) -> str:
    """The event's line: the first culprit, how many more, or the rate's guess."""
    if d.get("error"):
        return str(d["error"])
    culprits = [c for c in d.get("culprits") or [] if isinstance(c, Mapping)]
    if not culprits:
        guess = d.get("guess")
        return (f"nothing named over {d.get('steps')} steps (no growing tensor group, hook or "
                f"line of your code)" + (f"; a guess from the rate: {guess}" if guess else ""))
    more = f" (+{len(culprits) - 1} more)" if len(culprits) > 1 else ""
    return culprit_line(culprits[0]) + more
