"""memtop inside the training loops people do not write themselves: one callback each.

    from probes.integrations.transformers import MemtopCallback   # Hugging Face Trainer
    Trainer(model=model, args=args, train_dataset=ds, callbacks=[MemtopCallback()])

    from probes.integrations.lightning import MemtopCallback      # PyTorch Lightning
    lightning.Trainer(max_steps=1000, callbacks=[MemtopCallback()])

Each drives the public ``probes.Monitor`` (common.py: ``StepDriver``), so the run folder,
counters, profiler window, leak watch, ledger, hints and report are the same as for any loop,
and ``memtop view`` follows the run with every key working through its socket. The top layer of
probes/ (above monitor/). Nothing here is imported by ``import probes``: a module imports its
framework when it is imported itself, and a missing one raises ``FrameworkMissing`` naming the
extra to install (``pip install 'memtop[transformers]'`` / ``'memtop[lightning]'``).

Modules: common (StepDriver, batch_counts, the outputs leak demo; no framework imported),
transformers, lightning (each imports its framework). The names below load lazily
(probes/tools/lazy.py): common.py imports torch.
"""

from __future__ import annotations

from probes.tools.lazy import lazy_exports

_EXPORTS = dict.fromkeys(("FrameworkMissing", "OutputsLeakDemo", "StepDriver", "batch_counts",
                          "require"), ".common")
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
