"""memtop's own AMP training loop: the mini-GPT on its own thread, watched through probes' Monitor.

Step order follows the tutorial exactly: autocast region -> loss -> scaler.scale(loss).backward() ->
scaler.unscale_(optimizer) -> clip -> scaler.step -> scaler.update. Everything torch does happens on
the training thread (model build included): torch work on the UI thread slows training ~3×. The
Monitor (probes/monitor/monitor.py) does all the sampling, the instruments and the run folder,
exactly as it does for anyone's loop; this file adds only the model, the data and the leak demo.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import record_function

from probes import records as R
from probes.control.requests import RunControl
from probes.instruments.hooks import GPTShape, StepHook
from probes.monitor.monitor import Monitor
from probes.monitor.scope import StepScope
from probes.monitor.session import RunSession
from probes.records import Record
from probes.runfolder.state import RunState
from trainer.background import BackgroundRun
from trainer.config import TrainConfig, amp_reason, resolve_amp
from trainer.data import BatchSampler, load_corpus
from trainer.exit_codes import EXIT_FAILED, run_exit_code
from trainer.leaks import LeakInjector
from trainer.model import GPT

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

Sink = Callable[[Record], None]


def use_fused_adamw(device: torch.device) -> bool:
    """Fused AdamW on CUDA: one kernel for the update, and GradScaler hands it the found-inf
    flag as a tensor instead of reading it with ``.item()`` (torch/amp/grad_scaler.py, step()),
    so an fp16 step keeps a single host sync (the one read of loss, grad norm and scale). On
    CPU the default (foreach) implementation stays: there is no device to wait for."""
    return device.type == "cuda"


class Trainer(BackgroundRun):
    """Builds the model on its own thread and trains it until ``steps`` or a stop request.

    ``hooks``: the instruments (probes.monitor.default_hooks(**config.hook_options()) for
    memtop's usual set); none when not given. ``listen``: open the run's request socket for
    viewers.
    """

    thread_name = "memtop-trainer"

    def _thread_main(self) -> object:
        return self.run()

    def __init__(self, config: TrainConfig, run_dir: Path, control: RunControl | None = None,
                 sinks: list[Sink] | None = None, hooks: list[StepHook] | None = None,
                 freeze_gc: bool = True, listen: bool = True, rank: int | None = None,
                 device: torch.device | None = None, ddp: bool = False) -> None:
        self.config = config
        self.rank = rank  # under torch.distributed.run: this process's rank (own metrics file)
        self.device = device  # a rank's own device (cuda:LOCAL_RANK); the config's otherwise
        self.ddp = ddp  # wrap the model in DistributedDataParallel (process group already up)
        self.run_dir = Path(run_dir)
        self.hooks = list(hooks or [])
        self.freeze_gc = freeze_gc  # gc.freeze() once set-up is done (see run())
        self.listen = listen
        self.exit_code: int | None = None  # trainer/exit_codes.py: 0, 1 failed, 3 guard
        self.leak = LeakInjector(config.leak)
        self.monitor: Monitor | None = None
        self._thread: threading.Thread | None = None
        self.session = RunSession(self.run_dir, rank=rank, sinks=sinks or [],
                                  config=config.to_json(), control=control)
        self.control = self.session.control

    # what the rest of memtop reads -------------------------------------------------------------
    @property
    def sinks(self) -> list[Sink]:
        return self.session.recorder.sinks

    @property
    def sink_errors(self) -> list[str]:
        return self.session.recorder.sink_errors

    @property
    def write_failed(self) -> bool:
        return self.session.recorder.write_failed

    @property
    def status(self) -> RunState:
        """The run's state, folded from the records it wrote (probes/runfolder/state.py)."""
        return self.session.state

    def elapsed_s(self) -> float:
        return self.session.recorder.elapsed_s()

    # thread management -------------------------------------------------------------------------
    def abandon(self, reason: str, stuck: str | None = None) -> bool:
        """The process leaves while this thread is still busy: the run is sealed from the
        calling thread (probes/monitor/session.py, RunSession.abandon; ``stuck``: why its
        step will never finish)."""
        return self.session.abandon(reason, self.step_in_flight, stuck)

    @property
    def step_in_flight(self) -> int | None:
        """The step this thread is inside now (None between steps and outside the loop)."""
        mon = self.monitor
        return mon.step_in_flight if mon is not None else None

    # the run -------------------------------------------------------------------------------------
    def run(self) -> int:
        """Train; returns 0 when finished or stopped, 1 when the training failed."""
        cfg = self.config
        mon: Monitor | None = None
        try:
            device = self.device if self.device is not None else cfg.torch_device
            self.leak.device_type = device.type  # the graph demo retains its graph on CUDA
            if device.type == "cuda":
                # first: the profiler's stop, NVML and every torch.cuda call without a device
                # argument use the current device (cuda:0 unless set), not the chosen one
                torch.cuda.set_device(device)
            # bf16 checked on the chosen device's capability
            amp = cfg.amp_mode if self.device is None else resolve_amp(cfg.amp, device)
            self.session.run_started_extra["amp_reason"] = amp_reason(cfg.amp, device)
            torch.manual_seed(cfg.seed)  # the same initial weights on every rank
            gpt_model = GPT(cfg.model_config()).to(device)
            gpt = gpt_model.config
            model: torch.nn.Module = gpt_model
            if self.ddp:
                from torch.nn.parallel import DistributedDataParallel

                model = DistributedDataParallel(
                    gpt_model, device_ids=[device.index] if device.type == "cuda" else None)
            optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.1,
                                          fused=use_fused_adamw(device))
            scaler = torch.amp.GradScaler(device.type) if amp == "fp16" else None
            # each rank draws its own batches (seed + rank): DDP averages different gradients
            batches = BatchSampler(load_corpus(), cfg.batch_size, cfg.seq_len,
                                   cfg.seed + (self.rank or 0), device)
            mon = Monitor(
                model, optimizer, scaler=scaler, tokens_per_step=cfg.batch_size * cfg.seq_len,
                amp=amp, warmup_steps=cfg.warmup_steps, max_steps=cfg.steps,
                max_memory_bytes=cfg.max_memory_bytes, session=self.session, profiler=False,
                leak_watch=False, ledger=False, attribution=False, extra_hooks=self.hooks,
                listen=self.listen, write_report=False,
                model_shape=GPTShape(gpt.n_layer, gpt.n_head, gpt.n_embd, gpt.attention,
                                     gpt.block_size, gpt.vocab_size),
                config=cfg.to_json(),
                non_finite="fail", memory_history=cfg.memory_history,
                metrics_port=cfg.metrics_port, metrics_bind=cfg.metrics_bind,
                requests={"leak_start": lambda step: self._leak(step, start=True),
                          "leak_stop": lambda step: self._leak(step, start=False)})
            self.monitor = mon
            if self.freeze_gc:
                # torch, the model and the UI are ~200k long-lived objects; a gen-2 collection
                # walking them holds the GIL ~100 ms. Frozen, they are never walked again.
                gc.collect()
                gc.freeze()
            self._train(mon, model, optimizer, scaler, batches, device, amp)
            if cfg.save_weights and not self.rank and not self.session.recorder.write_failed \
                    and mon.step_count > 0:  # nothing trained (the guard at start): no weights
                # once per run, by rank 0 (the ranks' weights are the same after each step),
                # from the model itself: DistributedDataParallel wraps it and has no .config
                self._save_weights(mon, gpt_model, amp)
            mon.close()
            self.exit_code = run_exit_code(self.session.state,
                                           failed=self.session.recorder.write_failed)
        except Exception as exc:  # a monitoring tool stays up when the training fails
            if mon is not None:
                mon.close(error=exc)
            else:  # failed before the monitor existed (bad device, model build)
                self.session.record_error(0, exc)
            self.exit_code = EXIT_FAILED
            if isinstance(exc, AssertionError):
                raise  # a failed check (a test's sink, an invariant) fails its caller too
        finally:
            self.leak.stop()
            if mon is None:
                self.session.close()  # run_finished "failed" after the error row
            if self.exit_code is None:  # an exception this loop did not expect
                self.exit_code = EXIT_FAILED
        return self.exit_code

    def _train(self, mon: Monitor, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               scaler: torch.amp.GradScaler | None, batches: BatchSampler,
               device: torch.device, amp: str) -> None:
        cfg = self.config
        model.train()
        while (cfg.steps == 0 or mon.step_count < cfg.steps) and not mon.should_stop:
            with mon.step() as s:
                if s.step == cfg.leak_at and not self.leak.active:
                    self._leak(s.step, start=True)
                if s.step == cfg.leak_stop_at and self.leak.active:
                    self._leak(s.step, start=False)
                x, y = batches.next_batch()
                logits, loss = self.train_step(s, model, optimizer, scaler, x, y, device, amp)
                self.leak.keep(loss, logits)
                del x, y, logits, loss

    def train_step(self, s: StepScope, model: torch.nn.Module,
                   optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None,
                   x: torch.Tensor, y: torch.Tensor, device: torch.device,
                   amp: str) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step on (x, y) inside ``s``, in the tutorial's order (module
        docstring); the step's values handed to the Monitor. `memtop fit`'s probe runs the
        same step (trainer/fitprobe.py)."""
        autocast_dtype = AMP_DTYPES.get(amp)
        clip = self.config.grad_clip if self.config.grad_clip > 0 else float("inf")
        with record_function("forward"), torch.autocast(
            device_type=device.type, dtype=autocast_dtype or torch.float32,
            enabled=autocast_dtype is not None,
        ):
            logits, loss = model(x, y)
        with record_function("backward"):
            retain = self.leak.retain_graph  # the graph demo on CUDA (trainer/leaks.py)
            if scaler is not None:
                scaler.scale(loss).backward(retain_graph=retain)
            else:
                loss.backward(retain_graph=retain)
        with record_function("optimizer"):
            if scaler is not None:
                scaler.unscale_(optimizer)  # clipping must see true gradients
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if scaler is not None:
                scaler.step(optimizer)  # skipped inside when gradients hold inf/nan
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        s.set(loss=loss, grad_norm=grad_norm, output=logits)
        return logits, loss

    def _save_weights(self, mon: Monitor, model: GPT, amp: str) -> None:
        """weights.pt for `memtop infer --weights RUN`; a failure is recorded, not raised."""
        from probes.runfolder import WEIGHTS, weights_path
        from trainer.checkpoint import save_weights

        try:
            size = save_weights(model, weights_path(self.run_dir), step=mon.step_count, amp=amp,
                                seed=self.config.seed)
        except Exception as exc:
            mon.emit(R.WEIGHTS_SAVED, mon.step_count, {"error": f"{type(exc).__name__}: {exc}"})
            return
        mon.emit(R.WEIGHTS_SAVED, mon.step_count, {"path": WEIGHTS, "bytes": size})

    def _leak(self, step: int, start: bool) -> None:
        """Start the configured leak demo, or stop it and drop what it kept (training thread)."""
        mon = self.monitor
        if start and not self.leak.active:
            self.leak.start(step)
            if mon is not None:
                mon.emit(R.LEAK_DEMO_STARTED, step, {"kind": self.leak.kind,
                                                         "hint": self.leak.hint})
        elif not start and self.leak.active:
            dropped = self.leak.stop()
            if mon is not None:
                mon.emit(R.LEAK_DEMO_STOPPED, step, {"kind": self.leak.kind,
                                                         "released_tensors": dropped})
        if mon is not None:
            mon.leak_active = self.leak.active
