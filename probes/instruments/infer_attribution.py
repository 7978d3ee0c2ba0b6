"""A memory window over one request of `memtop infer`: per module, the KV cache it keeps and how
high its forward goes in the request's prefill and in a decode step (docs/ATTRIBUTION.md, "In
`memtop infer`").

The forward figures come from the training window's meter (probes/instruments/modmemory.py,
``ModuleMeter``: forward pre- and post-hooks reading the allocator's peak on CUDA, the heap in
use on CPU), put on for the measured step and taken off at its end whatever the step does;
under inference_mode autograd saves nothing, so the meter's saved-tensor side stays idle and a
module's activations are its transient forward peak. The cache's bytes per module are the
caller's (it owns the cache: trainer/infer.py), measured from the cache's storages. Outside a
window no hook is on the model.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from probes import records as R
from probes.instruments.modmemory import ModuleMeter, PeakReader, StepFigures
from probes.records.attribution import depth
from probes.records.infer_attribution import fold, infer_attribution_hints

MAX_ROWS = 300  # deeper rows fold into their ancestors until the event keeps at most these
PEAK_RULE_CPU = ("forward peak: the heap in use (mallinfo2) read at each module's entry and "
                 "exit, the highest reading inside the module minus the reading at its entry "
                 "(a sampled peak)")
PEAK_RULE_CUDA = ("forward peak: the CUDA allocator's peak inside the module (reset at each "
                  "module hook) minus memory_allocated at its entry")


class InferWindow:
    """One request's window: ``measuring(phase, step)`` around the prefill step and one decode
    step, then ``event_data(...)`` for the ``infer_attribution`` event."""

    def __init__(self, model: torch.nn.Module, device: torch.device, request: int,
                 trigger: str, phases: tuple[str, ...] = (R.PREFILL, R.DECODE)) -> None:
        self.request, self.trigger, self.phases = request, trigger, phases
        self.device = device
        self.meter = ModuleMeter(model, None, PeakReader(device))
        self.model_class = type(model).__name__
        self.figures: dict[str, StepFigures] = {}
        self.steps: dict[str, int] = {}
        self.hook_s = 0.0

    @property
    def modules_hooked(self) -> int:
        return self.meter.modules_hooked

    @property
    def measured_all(self) -> bool:
        """Every phase it measures has had its step."""
        return all(phase in self.steps for phase in self.phases)

    @property
    def error(self) -> str | None:
        return self.meter.error

    @contextlib.contextmanager
    def measuring(self, phase: str, step: int) -> Iterator[None]:
        """The hooks on for the body (one step's forward): off again however it ends."""
        t0 = time.perf_counter()
        self.meter.install()
        self.hook_s += time.perf_counter() - t0
        try:
            yield
        finally:
            t0 = time.perf_counter()
            self.meter.remove()
            figures = self.meter.take()
            self.figures[phase], self.steps[phase] = figures, step
            self.hook_s += time.perf_counter() - t0 + figures.hook_s

    def rows(self, kv_by_module: Mapping[str, int]) -> list[dict[str, Any]]:
        """A row per module (a shared module once, by its first name)."""
        pre = self.figures.get(R.PREFILL)
        dec = self.figures.get(R.DECODE)
        out = []
        for name in dict.fromkeys(self.meter.names.values()):
            row: dict[str, Any] = {"module": name,
                                   "params_bytes": self.meter.param_bytes.get(name, 0),
                                   "kv_cache_bytes": int(kv_by_module.get(name, 0))}
            for phase, fig in ((R.PREFILL, pre), (R.DECODE, dec)):
                row[f"{phase}_peak_bytes"] = fig.peaks.get(name) if fig is not None else None
                row[f"{phase}_ms"] = (round(fig.forward_s.get(name, 0.0) * 1000.0, 4)
                                      if fig is not None else None)
            row["calls"] = pre.calls.get(name, 0) if pre is not None else 0
            out.append(row)
        return bounded(out)

    def event_data(self, kv_by_module: Mapping[str, int], shape: Mapping[str, Any],
                   amp: str) -> dict[str, Any]:
        """The ``infer_attribution`` event's fields (probes/records/infer_attribution.py)."""
        rows = self.rows(kv_by_module)
        root = next((r for r in rows if r["module"] == ""), {})
        data: dict[str, Any] = {
            "request": self.request, "steps": sorted(self.steps.values()),
            "prefill_step": self.steps.get(R.PREFILL), "decode_step": self.steps.get(R.DECODE),
            "modules": rows, **shape,
            "params_total_bytes": sum(int(r["params_bytes"]) for r in rows),
            "kv_cache_total_bytes": sum(int(r["kv_cache_bytes"]) for r in rows),
            "prefill_step_peak_bytes": root.get("prefill_peak_bytes"),
            "decode_step_peak_bytes": root.get("decode_peak_bytes"),
            "counter": self.meter.reader.source,
            "peak_rule": PEAK_RULE_CUDA if self.device.type == "cuda" else PEAK_RULE_CPU,
            "modules_hooked": self.modules_hooked, "hook_ms": round(self.hook_s * 1000.0, 3),
            "trigger": self.trigger, "device": str(self.device), "amp": amp,
            "model_class": self.model_class}
        data["hints"] = infer_attribution_hints(data)
        return {k: v for k, v in data.items() if v is not None}


def bounded(rows: list[dict[str, Any]], max_rows: int = MAX_ROWS) -> list[dict[str, Any]]:
    """At most ``max_rows`` rows with the same totals: the deepest rows fold into their parents
    (parameters and cache added; the parent keeps its own peaks and times) until they fit."""
    level = max((depth(str(r["module"])) for r in rows), default=0)
    while len(rows) > max_rows and level > 1:
        level -= 1
        rows = list(fold(rows, level).values())
    return rows


__all__ = ["InferWindow", "bounded"]
