"""The public API for any training loop: ``Monitor`` around the loop, ``mon.step()`` around
each optimizer step. It owns the run's session (run folder, control, socket, counters) and its
instruments; ``memtop train``'s trainer and ``memtop infer``'s runner use the same parts.

    from probes import Monitor

    with Monitor(model, optimizer, tokens_per_step=B * T) as mon:
        for x, y in batches:
            with mon.step() as step:
                loss = loss_fn(model(x), y); loss.backward(); optimizer.step()
                step.set(loss=loss)
            if mon.should_stop:
                break

Names load lazily (probes/tools/lazy.py): these modules import torch.
"""

from __future__ import annotations

from probes.tools.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("Monitor", "StepScope"), ".monitor"),
    **dict.fromkeys(("default_hooks", "env_rank", "env_world_size"), ".setup"),
    **dict.fromkeys(("StepValues", "read_step_values"), ".stepvalues"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
