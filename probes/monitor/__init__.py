"""The writers' side: ``Monitor`` around any training loop, ``mon.step()`` around each optimizer
step, over a ``RunSession`` (run folder, control, socket, counters, request dispatch) that
every writer shares: the Monitor, ``memtop infer``'s runner (trainer/infer.py), and through
the Monitor the framework callbacks (probes/integrations/).

    from probes import Monitor

    with Monitor(model, optimizer, tokens_per_step=B * T) as mon:
        for x, y in batches:
            with mon.step() as step:
                loss = loss_fn(model(x), y); loss.backward(); optimizer.step()
                step.set(loss=loss)
            if mon.should_stop:
                break

    from probes.monitor import RunSession         # a writer with its own loop
    session = RunSession(run_dir, config=cfg); session.open(device); session.start(amp="off")

Modules: monitor (Monitor, StepScope), steppath (what the Monitor does each step), session
(RunSession, driver_label), steprow (the session's step row, from a memory reading and the
pollers' latest), setup (argument checks, default_hooks, rank and world size), stepvalues (a
step's scalars at one sync, the GradScaler's skipped steps).
Names load lazily (probes/tools/lazy.py): these modules import torch.
"""

from __future__ import annotations

from probes.tools.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("Monitor", "StepScope"), ".monitor"),
    **dict.fromkeys(("BUILTIN_REQUESTS", "RunSession", "driver_label"), ".session"),
    **dict.fromkeys(("default_hooks", "env_rank", "env_world_size"), ".setup"),
    **dict.fromkeys(("ScalerWatch", "StepValueReader", "StepValues", "non_finite_error",
                     "read_step_values"),
                    ".stepvalues"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
