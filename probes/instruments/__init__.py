"""Instruments that see each step of a monitored loop, on the training thread: the bounded
profiler window, the leak watch, the memory ledger and the live pitfall hints. Each is a
StepHook (hooks.py): ``setup(ctx)`` once, ``step_context(step)`` around the step's compute,
``end_step(step, tensors, sample)`` after its sample, ``close()`` at the end.

    from probes.instruments import StepHook, ProfilerWindow, LeakWatch, Ledger

    class CountSteps(StepHook):                       # your own instrument
        def end_step(self, step, tensors, sample):
            ...
    Monitor(model, opt, extra_hooks=[CountSteps()])

Names load lazily (probes/tools/lazy.py): these modules import torch.
"""

from __future__ import annotations

from probes.tools.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("GPTShape", "RunContext", "StepHook", "StepTensors"), ".hooks"),
    "ProfilerWindow": ".profwindow",
    **dict.fromkeys(("TRACE_NAME", "analyse_in_process", "export_trace", "stderr_to"),
                    ".proftrace"),
    **dict.fromkeys(("LeakAlert", "LeakCleared", "LeakDetector", "LeakDetectorConfig",
                     "LeakWatch", "likely_cause", "theil_sen_slope"), ".leak"),
    **dict.fromkeys(("Ledger", "SavedTensorMeter", "activation_prediction", "unique_bytes"),
                    ".ledger"),
    **dict.fromkeys(("HintWatch", "step_hints"), ".hints"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
