"""Instruments that see each step of a monitored loop, on the training thread: the bounded
profiler window, the memory attribution window (which module holds the memory), the leak
watch, the memory ledger and the live pitfall hints. Each is a
StepHook (hooks.py): ``setup(ctx)`` once, ``step_context(step)`` around the step's compute,
``end_step(step, tensors, sample)`` after its sample, ``close()`` at the end.

    from probes.instruments import StepHook, ProfilerWindow, LeakWatch, Ledger

    class CountSteps(StepHook):                       # your own instrument
        def end_step(self, step, tensors, sample):
            ...
    Monitor(model, opt, extra_hooks=[CountSteps()])

Modules: hooks (StepHook, RunContext), profwindow (the window's state machine) and proftrace
(what it writes, stderr kept off the terminal), attribution (MemoryAttribution: the memory
window) and modmemory (ModuleMeter: its per-module hooks for one step), leak (LeakDetector: the
rule) and leakwatch (LeakWatch: the hook that feeds it), ledger (the Ledger hook and its
formulas) and tensor_bytes (bytes by storage, what autograd saves), hints.
Names load lazily (probes/tools/lazy.py): these modules import torch.
"""

from __future__ import annotations

from probes.tools.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("GPTShape", "RunContext", "StepHook", "StepTensors"), ".hooks"),
    "ProfilerWindow": ".profwindow",
    "MemoryAttribution": ".attribution",
    **dict.fromkeys(("ModuleMeter", "PeakReader"), ".modmemory"),
    **dict.fromkeys(("TRACE_NAME", "analyse_in_process", "export_trace", "stderr_to"),
                    ".proftrace"),
    **dict.fromkeys(("LeakAlert", "LeakCleared", "LeakDetector", "LeakDetectorConfig",
                     "theil_sen_slope"), ".leak"),
    **dict.fromkeys(("LeakWatch", "likely_cause"), ".leakwatch"),
    **dict.fromkeys(("Ledger", "SAMPLE_EVERY", "activation_prediction"), ".ledger"),
    **dict.fromkeys(("SavedTensorMeter", "classify", "storage_key", "unique_bytes"),
                    ".tensor_bytes"),
    **dict.fromkeys(("HintWatch", "step_hints"), ".hints"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
