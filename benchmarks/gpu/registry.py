"""The GPU check's claims: one self-contained function per claim, and what they share.

A claim is one statement about memtop on a real CUDA device, checked by one function that
returns PASS, FAIL or NOT RUN with its figures. benchmarks/gpu/check.py runs every claim it
finds and writes summary.md / summary.json after each one. To add claims, add a module
``benchmarks/gpu/claims/<area>.py`` (the check imports every module of that package, sorted; no
other file changes, so additions from several branches merge cleanly) and give each new claim
a row in benchmarks/RESULTS.md (``gpu/<name>``, NOT RUN: tests/unit/test_results_table.py):

    from benchmarks.gpu.registry import Ctx, Outcome, claim

    @claim(group="attention", needs_s=20)
    def sdpa_peak_below_explicit(ctx: Ctx) -> Outcome:
        '''at T=512 sdpa attention keeps a lower step peak than explicit attention on CUDA
        (no B×h×T² scores)'''
        explicit = ctx.train("explicit", ctx.config(seq_len=512, block_size=512, steps=6))
        sdpa = ctx.train("sdpa", ctx.config(seq_len=512, block_size=512, steps=6,
                                            attention="sdpa"))
        a, b = explicit.max_step_peak(), sdpa.max_step_peak()
        return Outcome.check(b < a, f"step peak sdpa {b} vs explicit {a} bytes",
                             explicit_peak_bytes=a, sdpa_peak_bytes=b)

The rules a claim keeps:
- It answers on its own: what it needs it runs itself, or takes from ``ctx.shared(key, fn)``
  (a run several claims read, made once and kept as plain data: records and figures, never a
  model or a tensor).
- An exception is its FAIL (the runner keeps the traceback and goes on with the next claim);
  ``Outcome.not_run(why)`` where it has no meaning here (CPU, one GPU, a missing driver
  feature); ``cuda_only=True`` (the default) says NOT RUN on a CPU without calling it.
- It leaves nothing on the device: ``ctx.train`` returns the run's records, drops the trainer and
  frees the allocator's cache; the runner compares allocated memory before and after each claim
  (the ``runs_free_their_memory`` claim counts the device tensors Python still reaches).
- It fits its time: it is not started with less than ``needs_s`` seconds of budget left, and is
  given up at ``limit_s`` (a FAIL; the next claim runs).
- A claim is named after its function and stated by its docstring (summary.md and RESULTS.md
  quote it); names are unique (a second claim of the same name is refused at import). Claims
  run in the order (priority, module name, definition order).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.gpu.device import free_device

PASS, FAIL, NOT_RUN = "PASS", "FAIL", "NOT RUN"
CLAIMS_PACKAGE = "benchmarks.gpu.claims"
# --device cpu: a smaller model so a smoke run (fp16 autocast is ~30x slower on CPU) is quick
CPU_MODEL = {"layers": 2, "dim": 64, "heads": 2, "batch_size": 8, "seq_len": 64,
             "block_size": 64}


@dataclasses.dataclass
class Outcome:
    """What a claim found: PASS / FAIL / NOT RUN, one line of detail, and its figures."""

    status: str
    detail: str = ""
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def check(cls, ok: bool, detail: str, **figures: Any) -> Outcome:
        return cls(PASS if ok else FAIL, detail, figures)

    @classmethod
    def not_run(cls, why: str, **figures: Any) -> Outcome:
        return cls(NOT_RUN, why, figures)


@dataclasses.dataclass(frozen=True)
class Claim:
    name: str
    text: str  # the statement, as summary.md lists it
    group: str  # what it is about (probes, profiler, memory, ...): --only takes groups too
    fn: Callable[[Ctx], Outcome]
    needs_s: float  # budget it needs to start
    limit_s: float  # given up after this long
    priority: int
    cuda_only: bool
    module: str
    order: int
    requires: tuple[str, ...] = ()  # modules it imports that a machine may lack: NOT RUN there


REGISTRY: dict[str, Claim] = {}


def claim(name: str | None = None, text: str | None = None, *, group: str,
          needs_s: float = 10.0, limit_s: float | None = None, priority: int = 50,
          cuda_only: bool = True,
          requires: tuple[str, ...] = ()) -> Callable[[Callable[[Ctx], Outcome]], Callable]:
    """Register ``fn(ctx) -> Outcome`` as the check of one claim (module docstring): the claim
    is named after the function and stated by its docstring, unless ``name`` and ``text`` say
    otherwise (a statement with figures in it)."""

    def register(fn: Callable[[Ctx], Outcome]) -> Callable[[Ctx], Outcome]:
        nonlocal name, text
        name = name or fn.__name__
        text = text or " ".join((fn.__doc__ or "").split())
        if name in REGISTRY:
            raise ValueError(f"GPU claim {name!r} is declared twice ({REGISTRY[name].module} "
                             f"and {fn.__module__})")
        REGISTRY[name] = Claim(name, text, group, fn, needs_s,
                               limit_s if limit_s is not None else max(60.0, 4 * needs_s),
                               priority, cuda_only, fn.__module__, len(REGISTRY), requires)
        return fn

    return register


def ordered_claims() -> list[Claim]:
    return sorted(REGISTRY.values(), key=lambda c: (c.priority, c.module, c.order))


def load_claim_modules() -> list[str]:
    """Import every module of benchmarks/gpu/claims/ (their @claim decorators fill REGISTRY)."""
    package = importlib.import_module(CLAIMS_PACKAGE)
    names = sorted(f"{CLAIMS_PACKAGE}.{m.name}" for m in pkgutil.iter_modules(package.__path__))
    for name in names:
        importlib.import_module(name)
    return names


# ---- what claims share ------------------------------------------------------------------------
@dataclasses.dataclass
class Run:
    """One memtop run as a claim reads it afterwards: its folder and records, no model."""

    run_dir: Path
    records: list[Any]
    exit_code: int | None
    error: str | None

    def events(self, name: str) -> list[Any]:
        from probes.records import Event

        return [r for r in self.records if isinstance(r, Event) and r.event == name]

    def steps(self) -> list[Any]:
        from probes.records import StepSample

        return [r for r in self.records if isinstance(r, StepSample)]

    def max_step_peak(self) -> int | None:
        peaks = [s.step_peak_allocated_bytes for s in self.steps()
                 if s.step_peak_allocated_bytes is not None]
        return max(peaks) if peaks else None


@dataclasses.dataclass
class Ctx:
    """What a claim gets: where to write, the device, the budget, a log, shared runs."""

    out: Path
    device: str
    deadline: float
    log: Callable[[str], None] = print
    cache: dict[str, Any] = dataclasses.field(default_factory=dict)
    leftovers: dict[str, int] = dataclasses.field(default_factory=dict)  # claim -> tensor bytes

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def torch_device(self) -> Any:
        """The device as a torch.device with its index ("cuda" is the current device, as torch
        reads it): set_per_process_memory_fraction and set_device refuse one without
        (probes/counters/device_index.py)."""
        from probes.counters.device_index import indexed_device

        return indexed_device(self.device)

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def config(self, **kw: Any) -> Any:
        """memtop's TrainConfig on this device, runs under OUT/runs (small on CPU)."""
        from trainer.config import TrainConfig

        base: dict[str, Any] = {"device": self.device, "run_dir": str(self.out / "runs")}
        if not self.is_cuda:
            base.update(CPU_MODEL)
        base.update(kw)
        return TrainConfig(**base)

    def shared(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()`` once per gpu_check run (plain data only); its exception is re-raised to
        every claim that asks, so each of them fails with the same cause."""
        if key not in self.cache:
            try:
                self.cache[key] = ("ok", make())
            except Exception as exc:
                self.cache[key] = ("error", exc)
            free_device()
        kind, value = self.cache[key]
        if kind == "error":
            raise RuntimeError(f"shared run {key!r} failed: {type(value).__name__}: "
                               f"{value}") from value
        return value

    def not_run(self, why: str, **figures: Any) -> Outcome:
        return Outcome.not_run(why, **figures)

    def train(self, name: str, cfg: Any, *, sinks: list | None = None,
              hooks: list | None = None, own_hooks: list | None = None, control: Any = None,
              timeout_s: float = 90.0, on_trainer: Callable[[Any], None] | None = None) -> Run:
        """memtop's Trainer with its own instruments (+ ``hooks``) on its thread, to its end;
        the records come back, the trainer and its model are dropped (no gc.freeze: its
        cycles are collected) and the cache is emptied."""
        from probes.control.requests import RunControl
        from probes.monitor import default_hooks
        from probes.runfolder import create_run_dir
        from trainer.loop import Trainer

        run_dir = create_run_dir(self.out / "runs" / name)
        records: list[Any] = []
        instruments = own_hooks if own_hooks is not None else default_hooks(
            **cfg.hook_options())
        trainer = Trainer(cfg, run_dir, control or RunControl(),
                          sinks=[*(sinks or []), records.append],
                          hooks=list(instruments) + list(hooks or []), freeze_gc=False)
        if on_trainer is not None:
            on_trainer(trainer)
        trainer.start()
        done = trainer.join(min(timeout_s, max(5.0, self.left_s())))
        if not done:
            trainer.control.stop("gpu_check: time limit")
            trainer.join(30)
        errors = list(getattr(trainer, "sink_errors", []))
        run = Run(run_dir, records, trainer.exit_code, trainer.status.error)
        del trainer, instruments
        free_device()
        if not done:
            raise TimeoutError(f"{name}: training did not finish in {timeout_s:.0f} s")
        if errors:  # memtop drops a sink that raises: a claim's ground truth would stop
            raise RuntimeError(f"{name}: a claim's sink raised on the training thread: "
                               f"{errors}")
        return run
