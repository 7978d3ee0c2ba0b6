"""The likely cause of a leak, guessed from its rate and one step's output size, with its fix
(the hint a ``leak_suspected`` event carries)."""

from __future__ import annotations

from probes.tools.units import format_bytes

# --------------------------------------------------------------------------------
GRAPH_FIX = "log loss.item() or keep loss.detach(), never the loss tensor itself"
TENSOR_FIX = ("move what you keep off the device (.detach().cpu()) or drop it; a kept tensor that "
              "still has a grad_fn also keeps its graph alive")
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
