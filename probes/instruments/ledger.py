"""The memory ledger: where a training step's bytes go, measured beside the tutorial's formulas.

Lines (docs/ARCHITECTURE.md, instruments): parameters, gradients, optimizer state, autocast weight
copies, saved activations, [CPU: runtime heap at start], other/temporaries, allocator cache. The
first five are exact sums over live tensors, deduplicated by storage (GPT ties wte and lm_head: one
storage, counted once). Saved activations come from ``torch.autograd.graph.saved_tensors_hooks`` on
a *sampled* step only. How tensors are counted and what autograd saves is measured:
probes/instruments/tensor_bytes.py; this file is the hook, its snapshot and the formulas.

Snapshot: counters are read at the end of the model's forward (its forward hook), the activation
height; gradients do not exist then (zero_grad(set_to_none=True)), so "other" is
``allocated − (parameters + optimizer state + weight copies + saved activations + live grads)``.
On CPU "allocated" is the glibc heap, which also holds torch's and Python's own allocations: the
gap is the point. On CUDA it is torch.cuda.memory_allocated (code path not run on this machine).

Activation formula, for memtop's GPT (derived by listing what autograd saves, then checked):
per layer and token, 16 width-D tensors are kept: LayerNorm inputs (2), LayerNorm outputs (2),
q, k, v, attention output, MLP fc output (4D) and GELU output (4D). Without AMP that is
k = 16 × 4 = 64 B; under autocast the two LayerNorm inputs stay fp32 and the 14 others are 2 B:
k = 2×4 + 14×2 = 36 B. Explicit attention adds the softmax output B×heads×T² per layer at s bytes
(4 fp32; 2 under CPU autocast; 6 under CUDA autocast, where softmax runs in fp32 and att@v saves a
half copy). sdpa keeps no T×T matrix. The LM head (log-softmax B×T×V in fp32) is outside the
formula on purpose: the note says how much it leaves unexplained.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from probes import records as R
from probes.counters.memory import heap_counters
from probes.instruments import ledger_fit
from probes.instruments.hooks import RunContext, StepHook, StepTensors
from probes.instruments.ledger_fit import rest_level
from probes.instruments.tensor_bytes import SavedTensorMeter, storage_key, unique_bytes
from probes.records import Event, StepSample
from probes.tools.units import format_bytes

WORKERS_LINE = "DataLoader workers"  # the loop's child processes (probes/counters/workers.py)
SAMPLE_EVERY = 50  # steps between two activation measurements (plus the first after warmup)
# and at least this long between two regular ones: on a fast step (a GPU's few ms) every 50th
# step was a measurement every ~0.15 s, each ~0.5 ms of hooks on a 4×4 Linear and more on a real
# model (issue 28). The first one and one for a new batch shape do not wait.
MIN_GAP_S = 2.0


def activation_prediction(batch: int, seq: int, dim: int, layers: int, heads: int,
                          attention: str, amp: str, device_type: str) -> dict[str, Any]:
    """The tutorial's estimate with k and s chosen for memtop's GPT (module docstring)."""
    half = amp in ("bf16", "fp16")
    k = 36 if half else 64
    per_token = batch * seq * dim * layers * k
    s = (6 if device_type == "cuda" else 2) if half else 4
    scores = batch * heads * seq * seq * layers * s if attention == "explicit" else 0
    formula = "B×T×D×L×k" + (" + B×h×T²×L×s" if scores else "")
    values = f"{batch}×{seq}×{dim}×{layers}×{k}"
    if scores:
        values += f" + {batch}×{heads}×{seq}²×{layers}×{s}"
    return {"bytes": per_token + scores, "scores_bytes": scores, "k": k, "s": s if scores else None,
            "formula": f"{formula} (k={k} B" + (f", s={s} B)" if scores else ")"),
            "values": values}


def _line(name: str, measured: int | None, predicted: int | None, formula: str,
          note: str) -> dict[str, Any]:
    return {"name": name, "measured_bytes": measured, "predicted_bytes": predicted,
            "formula": formula, "note": note}


def _changed(old: int | None, new: int | None) -> bool:
    if old is None or new is None:
        return old != new
    return abs(new - old) > max(64 * 1024, 0.02 * abs(old))


class Ledger(StepHook):
    """Measures the ledger on the first step after warmup, every ``every`` steps, and when the
    batch shape changes; emits a "ledger" event when a line moved (not every step)."""

    def __init__(self, every: int = SAMPLE_EVERY, min_gap_s: float = MIN_GAP_S) -> None:
        self.every = max(1, every)
        self.min_gap_s = min_gap_s
        self._measured_at: float | None = None  # perf_counter of the last measurement's start
        self._first = 1
        self._force_next = False
        self._shape: tuple[int, int] | None = None
        self._pending: dict[str, Any] | None = None
        self._last_lines: dict[str, int | None] | None = None
        self.measured_steps: list[int] = []
        self.latest: dict[str, Any] | None = None
        self.failed: str | None = None  # why the ledger stopped measuring, if it did
        # True while another instrument's saved-tensor hooks own the step (a memory attribution
        # window, set by the Monitor): a measurement due then is taken at the step after
        self.yield_to: Callable[[], bool] | None = None

    def setup(self, ctx: RunContext) -> None:
        self.ctx = ctx
        warmup, steps = ctx.warmup_steps, ctx.max_steps
        self._first = warmup + 1 if steps <= 0 else max(1, min(warmup + 1, steps))
        self._baseline: int | None = None
        if ctx.device.type != "cuda":  # the heap torch and Python hold before the first step
            allocated, _ = self._counters()
            model_bytes = (unique_bytes(ctx.model.parameters())[0]
                           + unique_bytes(ctx.model.buffers())[0])
            self._baseline = allocated - model_bytes if allocated is not None else None

    def measure_next(self) -> None:
        """Measure the next step whatever the schedule: `memtop fit` asks for each probe
        point's first measured step (trainer/fitprobe.py). Nothing after a failure."""
        if self._first >= 0:
            self._force_next = True

    def due(self, step: int) -> bool:
        if self._first < 0:
            return False
        if self._force_next and step >= self._first:
            return True
        if step == self._first:
            return True
        return step > self._first and (step - self._first) % self.every == 0 and (
            self._measured_at is None
            or time.perf_counter() - self._measured_at >= self.min_gap_s)

    def step_context(self, step: int) -> contextlib.AbstractContextManager[Any]:
        if not self.due(step):
            return contextlib.nullcontext()
        if self.yield_to is not None and self.yield_to():
            self._force_next = True
            return contextlib.nullcontext()
        return self._measure(step)

    def _counters(self) -> tuple[int | None, int | None]:
        device = self.ctx.device
        if device.type == "cuda":
            return torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
        heap = heap_counters()
        return heap if heap is not None else (None, None)

    @contextlib.contextmanager
    def _measure(self, step: int) -> Iterator[None]:
        """Hooks for one step; a failure of the ledger's own code never fails the training."""
        try:
            pending, handles = self._begin(step)
        except Exception as exc:
            self._fail(step, exc)
            yield
            return
        try:
            with pending["meter"]:
                yield
        finally:
            for h in handles:
                h.remove()
        try:
            t1 = time.perf_counter()
            pending["grad_bytes"] = sum(pending["grads"].values()) if pending["grads"] else None
            pending["opt"] = self._optimizer_state()
            pending["cost_s"] += pending["meter"].hook_s + (time.perf_counter() - t1)
            self._pending = pending
        except Exception as exc:
            self._fail(step, exc)

    def _begin(self, step: int) -> tuple[dict[str, Any], list[Any]]:
        t0 = self._measured_at = time.perf_counter()
        rest = rest_level(self.ctx.device)  # the level between steps: the live fit line's
        model, optimizer = self.ctx.model, self.ctx.optimizer
        params = list(model.parameters())
        param_bytes, param_keys = unique_bytes(params)
        buffer_bytes, buffer_keys = unique_bytes(model.buffers())
        _, state_keys = unique_bytes(v for s in optimizer.state.values() for v in s.values()
                                     if isinstance(v, torch.Tensor))
        grads: dict[tuple, int] = {}
        snap: dict[str, Any] = {}

        def on_grad(p: torch.Tensor) -> None:
            k = storage_key(p.grad) if p.grad is not None else None
            if k is not None:
                grads[k[:3]] = k[3]

        def on_forward_end(_module: Any, _inputs: Any, _output: Any) -> None:
            allocated, reserved = self._counters()
            self.ctx.memory.saw_heap(allocated)  # CPU: a reading of the step's peak too
            if "allocated" not in snap or (allocated or 0) > (snap["allocated"] or 0):
                live = unique_bytes(p.grad for p in params if p.grad is not None)[0]
                snap.update(allocated=allocated, reserved=reserved, grads_live=live)

        handles = [p.register_post_accumulate_grad_hook(on_grad)
                   for p in params if p.requires_grad]
        handles.append(model.register_forward_hook(on_forward_end))
        meter = SavedTensorMeter(exclude=param_keys | buffer_keys | state_keys)
        pending = {"step": step, "rest": rest, "params": params, "param_bytes": param_bytes,
                   "buffer_bytes": buffer_bytes, "grads": grads, "meter": meter, "snap": snap,
                   "cost_s": time.perf_counter() - t0}
        return pending, handles

    def _fail(self, step: int, exc: BaseException) -> None:
        """Stop measuring for the rest of the run and say why, once."""
        self.failed = f"{type(exc).__name__}: {exc}"
        self._pending = None
        self.every = 10**12
        self._first = -1
        self._force_next = False
        with contextlib.suppress(Exception):
            self.ctx.emit(Event(R.LEDGER_FAILED, step, self.ctx.elapsed_s(),
                                {"message": self.failed}))

    def _optimizer_state(self) -> dict[str, Any]:
        """Exact bytes of the optimizer's state tensors, by state key, deduplicated."""
        seen: dict[tuple, tuple[str, int]] = {}
        for per_param in self.ctx.optimizer.state.values():
            for name, value in per_param.items():
                if isinstance(value, torch.Tensor):
                    k = storage_key(value)
                    if k is not None:
                        seen[k[:3]] = (str(name), k[3])
        by_name: dict[str, int] = {}
        counts: dict[str, int] = {}
        for name, nbytes in seen.values():
            by_name[name] = by_name.get(name, 0) + nbytes
            counts[name] = counts.get(name, 0) + 1
        return {"by_name": by_name, "counts": counts}

    def end_step(self, step: int, tensors: StepTensors, sample: StepSample) -> None:
        out = tensors.output
        shape = tuple(int(n) for n in out.shape[:2]) if out is not None and out.dim() >= 2 \
            else None
        if self._shape is not None and shape != self._shape and self._pending is None:
            self._force_next = True  # B or T changed since the last measurement
        if self._pending is None or self._pending["step"] != step:
            return
        t0 = time.perf_counter()
        pending, self._pending = self._pending, None
        self._force_next = False
        self._shape = shape
        try:
            data = self._build(pending, sample)
        except Exception as exc:
            self._fail(step, exc)
            return
        data["measure_ms"] = round((pending["cost_s"] + time.perf_counter() - t0) * 1000.0, 3)
        self.measured_steps.append(step)
        self.latest = data
        lines = {ln["name"]: ln["measured_bytes"] for ln in data["lines"]}
        last = self._last_lines
        if last is None or set(last) != set(lines) or any(
                _changed(last[n], lines[n]) for n in lines):
            self._last_lines = lines
            self.ctx.emit(Event(R.LEDGER, step, self.ctx.elapsed_s(), data))

    def _build(self, p: dict[str, Any], sample: StepSample) -> dict[str, Any]:
        gpt, device, amp = self.ctx.model_shape, self.ctx.device, self.ctx.amp
        params: list[torch.Tensor] = p["params"]
        n_params = sum(t.numel() for t in params)
        dtypes = {t.dtype for t in params}
        param_dtype = max(dtypes, key=lambda d: sum(t.numel() for t in params if t.dtype == d))
        esize = torch.empty((), dtype=param_dtype).element_size()
        meter: SavedTensorMeter = p["meter"]
        opt_by_name: dict[str, int] = p["opt"]["by_name"]
        opt_counts: dict[str, int] = p["opt"]["counts"]
        master = sum(v for n, v in opt_by_name.items() if "master" in n.lower())
        opt_bytes = sum(opt_by_name.values()) - master
        B, T = self._shape if gpt is not None and self._shape else (None, None)
        P = f"P={n_params:,}"
        lines = [_line("parameters", p["param_bytes"], n_params * esize, f"P × {esize} B",
                       f"{P} {str(param_dtype).replace('torch.', '')}, tied weights counted "
                       f"once; buffers ({format_bytes(p['buffer_bytes'])}) are in other")]
        lines.append(_line("gradients", p["grad_bytes"], n_params * esize, f"P × {esize} B",
                           "live from backward to zero_grad(set_to_none): not at the "
                           "forward-end snapshot"))
        adam = "adam" in type(self.ctx.optimizer).__name__.lower()
        parts = ", ".join(f"{n} {format_bytes(v)}" + (f" ({opt_counts[n]} tensors)"
                          if n == "step" else "") for n, v in sorted(opt_by_name.items()))
        lines.append(_line("optimizer state", opt_bytes, 2 * n_params * 4 if adam else None,
                           "2 × P × 4 B (AdamW, fp32)" if adam else "n/a for this optimizer",
                           parts or "no state yet"))
        if master:
            lines.append(_line("master weights", master, n_params * 4, "P × 4 B (fp32)",
                               "fp32 copies kept by the optimizer"))
        copies = meter.bytes_by_kind["weight"]
        if copies or amp != "off":
            lin, _ = unique_bytes(m.weight for m in self.ctx.model.modules()
                                  if isinstance(m, torch.nn.Linear))
            n_lin = lin // esize if esize else 0
            # P_linear × 2 B holds for memtop's GPT (only Linear layers autocast); other
            # models cast convolutions too, so their copies are measured only.
            predicted = (n_lin * 2 if amp != "off" else 0) if gpt is not None else None
            lines.append(_line("autocast weight copies", copies, predicted,
                               "P_linear × 2 B" if gpt is not None else "measured only",
                               f"{amp} casts of weights saved for backward; no master "
                               "weights: the fp32 weights are the masters"))
        pred = None  # formulas only for memtop's own GPT; any other model is measured only
        if gpt is not None and B is not None and T is not None:
            pred = activation_prediction(B, T, gpt.dim, gpt.layers, gpt.heads, gpt.attention,
                                         amp, device.type)
        acts = meter.activation_bytes
        note = (f"B={B} T={T}, " if B is not None else "") + f"{meter.tensors} saved tensors"
        if pred is not None:
            note = f"{pred['values']}; " + note
            if pred["scores_bytes"]:
                note += (f"; T×T scores {format_bytes(meter.bytes_by_kind['scores'])} vs "
                         f"{format_bytes(pred['scores_bytes'])} predicted")
            note += f"; off by {format_bytes(acts - pred['bytes'])} (LM head, LN stats, masks)"
        lines.append(_line("saved activations", acts, pred["bytes"] if pred else None,
                           pred["formula"] if pred else "measured only", note))
        snap = p["snap"]
        allocated, reserved = snap.get("allocated"), snap.get("reserved")
        at_snapshot = (p["param_bytes"] + opt_bytes + master + copies + acts
                       + snap.get("grads_live", 0))
        cpu = device.type != "cuda"
        explained = at_snapshot
        if cpu and self._baseline is not None:
            lines.append(_line("runtime heap at start", self._baseline, None,
                               "heap before step 1 − model tensors",
                               "glibc heap that torch, its libraries and Python held "
                               "before training (not tensors of this model)"))
            explained += self._baseline
        other = allocated - explained if allocated is not None else None
        used, held = (R.counter_name(pane, device.type) for pane in ("allocated", "reserved"))
        lines.append(_line("other / temporaries", other, None,
                           f"{used} − lines above, at end of forward",
                           ("heap growth outside the lines above: batch, buffers, autograd and "
                            "oneDNN bookkeeping, leaks" if cpu else
                            "batch, buffers, workspaces, logits, leaks")))
        cache = reserved - allocated if reserved is not None and allocated is not None else None
        lines.append(_line(R.CACHE_LINE["cpu" if cpu else "cuda"], cache, None,
                           f"{held} − {used}",
                           "free bytes glibc keeps from the OS" if cpu else
                           "cached blocks; empty_cache() returns them but is no fix"))
        if sample.workers:  # other processes: beside the ledger, never in its sums
            lines.append(_line(WORKERS_LINE, sample.workers_pss_bytes, None,
                               f"PSS of {sample.workers} process"
                               f"{'es' if sample.workers > 1 else ''}",
                               f"host memory outside this process: USS "
                               f"{format_bytes(sample.workers_uss_bytes)} their own, RSS "
                               f"{format_bytes(sample.workers_rss_bytes)} with shared pages "
                               "counted per worker; not in the tensors or the heap"))
        total = sum(ln["measured_bytes"] or 0 for ln in lines if ln["name"] not in (
            "runtime heap at start", "other / temporaries", WORKERS_LINE,
            *R.CACHE_LINE.values()))
        return {
            "lines": lines, "total_measured_bytes": total, "allocated_bytes": allocated,
            "reserved_bytes": reserved, "sampled_step": p["step"],
            "tensors_at_snapshot_bytes": at_snapshot,  # exact lines alive at the snapshot
            "explained_bytes": explained,  # + the runtime heap at start (CPU)
            "unexplained_bytes": other,
            "unexplained_ratio": round(other / allocated, 4) if other is not None and allocated
            else None,
            "peak_allocated_bytes": sample.peak_allocated_bytes,
            "snapshot": "end of forward (activation height)",
            "counter": self.ctx.memory.counter_source, "device": str(device), "amp": amp,
            "batch_size": B, "seq_len": T, "attention": gpt.attention if gpt else None,
            "attention_scores_bytes": meter.bytes_by_kind["scores"],
            "predicted_attention_scores_bytes": pred["scores_bytes"] if pred else None,
            "model": {"params": n_params, "param_dtype": str(param_dtype).replace("torch.", ""),
                      "vocab_size": _vocab(self.ctx.model)},
            "sample_every": self.every, "min_gap_s": self.min_gap_s,
            "batch_dim": self._shape[0] if self._shape else None,
            **ledger_fit.facts(self.ctx, p["rest"]),
        }


def _vocab(model: torch.nn.Module) -> int | None:
    config = getattr(model, "config", None)
    value = getattr(config, "vocab_size", None)
    return int(value) if isinstance(value, int) else None
