"""The likely cause of a leak, guessed from its rate and one step's output size (or, for the
DataLoader workers, from how their growth splits between them), with its fix (the hint a
``leak_suspected`` event carries)."""

from __future__ import annotations

from probes.counters.workers import WorkersReading
from probes.records.culprits import FIXES
from probes.tools.units import format_bytes

# --------------------------------------------------------------------------------
GRAPH_FIX = "log loss.item() or keep loss.detach(), never the loss tensor itself"
TENSOR_FIX = ("move what you keep off the device (.detach().cpu()) or drop it; a kept tensor that "
              "still has a grad_fn also keeps its graph alive")
WORKERS_FIX = FIXES["workers"]
HOST_TENSOR_FIX = ("drop what you keep, or keep only what you need (a float from .item(), a small "
                   "detached slice); a kept tensor that still has a grad_fn also keeps its graph")


def likely_cause(counter: str, bytes_per_step: float,
                 output_bytes: int | None) -> tuple[str, str]:
    """("graph" | "tensors", hint) from the growth rate and one step's output (logits) size.

    A kept output tensor grows memory by a whole multiple of its size each step; a retained
    autograd graph grows the host heap by many small objects (~150 KiB/step for the default
    model), not tensor-sized. This is a guess from sizes alone, so the hint says "likely".
    """
    rate = format_bytes(bytes_per_step)
    if output_bytes:
        ratio = bytes_per_step / output_bytes
        if ratio >= 0.9 and abs(ratio - round(ratio)) <= 0.15:
            times = f"{round(ratio)}×" if round(ratio) > 1 else "about"
            fix = TENSOR_FIX if counter == "device_allocated" else HOST_TENSOR_FIX
            return "tensors", (f"tensors accumulating, likely: {rate}/step is {times} the size of "
                               f"one step's output ({format_bytes(output_bytes)}); {fix}")
    if counter != "device_allocated":  # host memory: small objects are graph nodes
        size = f", far less than one step's output ({format_bytes(output_bytes)})" if (
            output_bytes and bytes_per_step < 0.9 * output_bytes) else ""
        return "graph", (f"a retained autograd graph, likely: {rate}/step of small host "
                         f"objects{size}, as when losses.append(loss) keeps each step's graph; "
                         f"{GRAPH_FIX}")
    return "tensors", f"tensors accumulating on the device, likely: {rate}/step; {TENSOR_FIX}"


def workers_cause(bytes_per_step: float, reading: WorkersReading | None,
                  from_start: bool) -> tuple[str, str, str]:
    """(likely cause, pattern, hint) of the DataLoader workers' growth, from how it splits
    between them (each worker's USS since it was first seen) and whether it began with them.

    Growth that is about equal in every worker and starts with their first items is the
    dataset's doing, not one item's: a cache in ``__getitem__``, or copy-on-read (forked workers
    read Python objects they inherited, and each read writes a reference count, copying the
    page into the worker); memtop cannot tell the two apart from outside the workers."""
    rate = format_bytes(bytes_per_step)
    grown = reading.growth_by_child() if reading is not None else {}
    n = len(grown)
    positive = [g for g in grown.values() if g > 0]
    equal = n >= 2 and len(positive) == n and min(positive) >= 0.5 * max(positive)
    when = "from their first items" if from_start else "after a while"
    if equal or n == 1:
        each = (f"each of the {n} grows alike ({', '.join(format_bytes(g) for g in grown.values())}"
                f" since it started)" if n > 1 else "the one worker grows")
        return ("dataset cache or copy-on-read", "equal" + ("" if not from_start else
                                                            ", from the start"),
                f"{rate}/step in the DataLoader workers, {each}, {when}: a dataset that keeps "
                "what __getitem__ returns (a cache), or copy-on-read of Python objects the "
                f"workers inherited (a list or dict read by index writes reference counts, so "
                f"each worker copies the pages it reads); {WORKERS_FIX}")
    if grown:
        pid, most = max(grown.items(), key=lambda kv: kv[1])
        return ("one worker's items", "unequal",
                f"{rate}/step in the DataLoader workers, mostly worker {pid} "
                f"({format_bytes(most)} of {format_bytes(sum(positive))}): something only some "
                f"items do (a cache of some items, a buffer that grows with an item's size); "
                f"{WORKERS_FIX}")
    return ("workers", "unknown", f"{rate}/step in the DataLoader workers; {WORKERS_FIX}")
