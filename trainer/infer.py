"""memtop's inference loop: requests of B sequences, each a prefill then one decode step per
token, over the KV cache (trainer/model.py), on one background thread like the trainer.

The tutorial's three switches (§2.4) are set where inference starts: model.eval(),
torch.inference_mode() around every step, and no GradScaler (nothing is trained). Every step is
one row of metrics.jsonl with its phase, tokens, wall time, the cache's measured bytes beside
2 × layers × B × T × dim × bytes, and the usual counters; a step ends when its new tokens are on
the host (what a server streams), so step time includes the device's work. docs/INFERENCE.md.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import record_function

from probes import records as R
from probes.control.requests import RunControl
from probes.counters.host import cpu_bf16_override, read_cpu_flags
from probes.instruments.hints import cpu_bf16_problem, hint_fields
from probes.instruments.hooks import GPTShape
from probes.monitor.session import RunSession
from probes.records import StepSample, is_disturbed
from probes.runfolder.recorder import Sink
from probes.runfolder.state import RunState
from probes.tools.kvcache import (
    DTYPE_BYTES,
    KV_FORMULA,
    admission,
    kv_bytes_per_token,
    kv_cache_bytes,
)
from probes.tools.stats import percentile
from trainer.background import BackgroundRun
from trainer.config import amp_reason
from trainer.data import load_corpus
from trainer.infer_config import InferConfig, ModelSpec
from trainer.infer_profile import PhaseProfiler
from trainer.infer_window import InferMemoryWindows
from trainer.model import GPT, KVCache, sample_next

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class InferenceRunner(BackgroundRun):
    """Runs the requests on its own thread; same shape as trainer.loop.Trainer, over the same
    RunSession (probes/monitor/session.py) as every writer."""

    thread_name = "memtop-infer"

    def _thread_main(self) -> object:
        return self.run()

    def __init__(self, config: InferConfig, spec: ModelSpec, run_dir: Path,
                 control: RunControl | None = None, sinks: list[Sink] | None = None,
                 listen: bool = True, freeze_gc: bool = True) -> None:
        self.config = config
        self.spec = spec
        self.run_dir = Path(run_dir)
        self.listen = listen
        self.freeze_gc = freeze_gc
        self.exit_code: int | None = None
        self._thread: threading.Thread | None = None
        gpt = spec.config
        self.config_json = {**config.to_json(), "layers": gpt.n_layer, "heads": gpt.n_head,
                            "dim": gpt.n_embd, "block_size": gpt.block_size,
                            "attention": gpt.attention, "weights_source": spec.source}
        self.session = RunSession(self.run_dir, sinks=sinks or [], config=self.config_json,
                                  control=control, label="inference run")
        self.control = self.session.control
        self.request = 0  # the request running (1-based)
        self.profiler: PhaseProfiler | None = None

    @property
    def status(self) -> RunState:
        return self.session.state

    def elapsed_s(self) -> float:
        return self.session.recorder.elapsed_s()

    @property
    def sink_errors(self) -> list[str]:
        return self.session.recorder.sink_errors

    def abandon(self, reason: str) -> bool:
        """The process leaves while this thread is still busy: the run is sealed from the
        calling thread (probes/monitor/session.py, RunSession.abandon)."""
        return self.session.abandon(reason)

    # the run -----------------------------------------------------------------------------------
    def run(self) -> int:
        """Generate; 0 when finished or stopped, 1 when it failed."""
        cfg = self.config
        try:
            device, amp = cfg.resolve()
            if device.type == "cuda":
                torch.cuda.set_device(device)
            torch.manual_seed(cfg.seed)
            model = GPT(self.spec.config)
            if self.spec.state is not None:
                model.load_state_dict(self.spec.state)
            model.to(device)
            model.eval()  # switch 1: dropout off, the same prompt gives the same tokens
            self._setup(model, device, amp)
            if self.freeze_gc:
                gc.collect()
                gc.freeze()
            self._generate(model)
            self.exit_code = 0
        except Exception as exc:  # a monitoring tool stays up and says why
            self.session.record_error(self.session.step, exc)
            self.exit_code = 1
        if self.profiler is not None:
            with contextlib.suppress(Exception):
                self.profiler.close()
        self.session.close()  # "failed" after an error row, else finished or the stop's reason
        return self.exit_code

    def _setup(self, model: GPT, device: torch.device, amp: str) -> None:
        cfg, gpt, session = self.config, self.spec.config, self.session
        self.device, self.amp = device, amp
        self.memory = session.open(device)
        self.bpe = DTYPE_BYTES[amp]
        for block in model.transformer.h:  # CPU: fold mid-forward heap readings into the peak
            block.register_forward_hook(lambda *_: self.memory.observe_peak())
        phases = {"both": (R.PREFILL, R.DECODE), "none": (),
                  "auto": (R.PREFILL, R.DECODE) if cfg.requests >= 2 else ()}.get(
            cfg.profile_phase, (cfg.profile_phase,))
        self.profiler = prof = PhaseProfiler(phases, cfg.profile_active,
                                             at_request=cfg.profiled_request() or 1)
        prof.setup(session.context(
            model, None, None, amp, max_steps=0,
            model_shape=GPTShape(gpt.n_layer, gpt.n_head, gpt.n_embd, gpt.attention,
                                 gpt.block_size, gpt.vocab_size),
            config=self.config_json))
        # `p`: the next request's prefill and decode steps (a window never mixes phases)
        session.offer("profile", lambda step: prof.rearm(self.request + 1))
        # `a`: a memory window in the next request free of the warm-up and the profiler
        self.windows = windows = InferMemoryWindows(
            session, model, device, amp,
            {"batch_size": cfg.batch_size, "prompt_len": cfg.prompt_len,
             "block_size": gpt.block_size, "attention": gpt.attention},
            prof, cfg.requests, cfg.attribute_request)
        session.offer("attribute", lambda step: windows.want(self.request + 1, "key"))
        session.offer("attribute_cancel",
                      lambda step: windows.cancel(step, "cancelled by the a key"))
        if self.listen:
            session.listen()
        self.weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        session.start(
            amp=amp, amp_reason=amp_reason(cfg.amp, device),
            params=sum(p.numel() for p in model.parameters()), mode="infer",
            weights=self.spec.source, weights_bytes=self.weights_bytes,
            switches={"eval": not model.training, "inference_mode": True, "grad_scaler": None},
            kv_formula=KV_FORMULA,
            kv_bytes_per_token=kv_bytes_per_token(gpt.n_layer, gpt.n_embd, self.bpe))
        if device.type == "cpu":  # `--amp bf16` where bf16 is emulated: the hint train gives
            problem = cpu_bf16_problem(amp, read_cpu_flags(), cpu_bf16_override())
            if problem:
                session.emit(R.HINT, 0, hint_fields("cpu_bf16_emulated", problem))
        self.gen = torch.Generator(device=device).manual_seed(cfg.seed)

    # requests ------------------------------------------------------------------------------------
    def _prompts(self, request: int) -> torch.Tensor:
        """B windows of the shipped text, different for each request, the same for each seed."""
        cfg = self.config
        data = self._corpus
        g = torch.Generator().manual_seed(cfg.seed + request)
        starts = torch.randint(0, data.numel() - cfg.prompt_len, (cfg.batch_size,), generator=g)
        idx = starts[:, None] + torch.arange(cfg.prompt_len)[None, :]
        return data[idx].to(self.device)

    def _generate(self, model: GPT) -> None:
        self._corpus = load_corpus().long()
        self.memory.reset_peak()
        for request in range(1, self.config.requests + 1):
            self.request = request
            if self.session.boundary(self.session.step + 1):
                break
            self._request(model, request)
            if self.control.stop_requested:
                break
        self.windows.finish(self.session.step, self.control.stop_requested)
        if self.control.stop_requested:
            return
        if self.config.baseline_tokens > 0 and not self.control.stop_requested:
            self._cache_baseline(model)

    def _request(self, model: GPT, request: int) -> None:
        cfg, prof, session = self.config, self.profiler, self.session
        assert prof is not None
        prompt = self._prompts(request)
        cache = model.new_cache()
        used_before = self.memory.read().allocated_bytes
        session.step += 1
        self.windows.begin(request, session.step, cfg.new_tokens - 1)
        prof.maybe_open(session.step, R.PREFILL, request, 0)
        first, tok, prefill_peak = self._step(R.PREFILL, request, cache,
                                              lambda t: model.prefill(prompt, cache), None)
        decode: list[StepSample] = []
        for i in range(cfg.new_tokens - 1):
            if session.boundary(session.step + 1):
                break
            session.step += 1
            if i >= 1:  # the first decode step of a request is left out of the window
                prof.maybe_open(session.step, R.DECODE, request, cfg.new_tokens - 1 - i)
            sample, tok, _ = self._step(R.DECODE, request, cache,
                                        lambda t: model.decode_step(t, cache), tok)
            decode.append(sample)
        clean = [s.step_ms for s in decode if not is_disturbed(s)]  # records/disturbed.py
        dec_s = sum(s.step_ms for s in decode) / 1000.0
        session.emit(R.REQUEST_DONE, session.step, {
            "request": request, "ttft_ms": first.step_ms,
            "decode_ms_p50": percentile(clean, 50), "decode_ms_p95": percentile(clean, 95),
            "prefill_tokens_per_s": first.tokens_per_s,
            "decode_tokens_per_s": (cfg.batch_size * len(decode) / dec_s) if dec_s else None,
            "kv_cache_bytes": cache.nbytes(),
            "kv_cache_predicted_bytes": self._predicted(cache.length),
            "new_tokens": 1 + len(decode)})
        if request == 1 and used_before is not None and prefill_peak is not None:
            self._admission(used_before, prefill_peak, first.kv_cache_bytes or 0)

    def _predicted(self, positions: int) -> int:
        gpt = self.spec.config
        return kv_cache_bytes(gpt.n_layer, self.config.batch_size, positions, gpt.n_embd,
                              self.bpe)

    def _compute(self, phase: str) -> contextlib.ExitStack:
        """The step's region: its profiler label, inference_mode (switch 2), autocast."""
        stack = contextlib.ExitStack()
        dtype = AMP_DTYPES.get(self.amp)
        stack.enter_context(record_function(phase))
        stack.enter_context(torch.inference_mode())
        stack.enter_context(torch.autocast(self.device.type, dtype=dtype or torch.float32,
                                           enabled=dtype is not None))
        return stack

    def _step(self, phase: str, request: int, cache: KVCache,
              fn: Callable[[torch.Tensor | None], torch.Tensor], tok: torch.Tensor | None) \
            -> tuple[StepSample, torch.Tensor, int | None]:
        cfg, session = self.config, self.session
        assert self.profiler is not None
        tracing = self.profiler.tracing
        self.memory.begin_step()  # this step's own peak (the run's is their max)
        t0 = time.perf_counter()
        with self._compute(phase):
            with self.windows.measuring(phase, session.step):
                logits = fn(tok)
            nxt = sample_next(logits, top_k=cfg.top_k, temperature=cfg.temperature,
                              generator=self.gen)
        nxt.cpu()  # the new tokens reach the host: the step (and on CUDA the device) is done
        dt = max(time.perf_counter() - t0, 1e-9)
        disturbed = session.disturbance(session.step, tracing)  # out of the run's peak too
        reading = self.memory.read(count_peak=disturbed is None)
        tokens = cfg.batch_size * (cfg.prompt_len if phase == R.PREFILL else 1)
        sample = session.step_sample(
            session.step, reading, dt, amp=self.amp, tokens_in_step=tokens, profiling=tracing,
            disturbed=disturbed, phase=phase, tokens=tokens, request=request,
            context_tokens=cache.length, kv_cache_bytes=cache.nbytes(),
            kv_cache_predicted_bytes=self._predicted(cache.length))
        session.recorder.publish(sample)
        self.profiler.end_step(session.step, sample)
        self.windows.after_step(phase, session.step, cache)
        return sample, nxt, reading.step_peak_allocated_bytes

    def _admission(self, used: int, prefill_peak: int, kv_after_prefill: int) -> None:
        cfg, gpt = self.config, self.spec.config
        budget, source = cfg.max_memory_bytes, "--max-memory"
        if budget is None:
            budget = self.session.device_total_bytes or 0
            source = "device total" if self.device.type == "cuda" else "host RAM"
        seq_len = cfg.prompt_len + cfg.new_tokens
        temp = (prefill_peak - used - kv_after_prefill) // cfg.batch_size
        adm = admission(budget, source, used, self.weights_bytes,
                        kv_cache_bytes(gpt.n_layer, 1, seq_len, gpt.n_embd, self.bpe), temp,
                        seq_len)
        self.session.emit(R.ADMISSION, self.session.step, adm.to_json())

    # the cache-off baseline ----------------------------------------------------------------------
    def _cache_baseline(self, model: GPT) -> None:
        """The same short generation with the cache and by recomputing the whole context per
        token (prompt 1's sequences, greedy): the cache's speed/memory trade, measured."""
        n = self.config.baseline_tokens
        prompt = self._prompts(1)
        runs = {}
        for mode in ("cached", "recompute"):
            cache = model.new_cache() if mode == "cached" else None
            seq, times, peak = prompt, [], 0
            for i in range(n):
                self.memory.reset_peak()
                t0 = time.perf_counter()
                with self._compute(R.PREFILL if mode == "cached" and i == 0 else
                                   R.DECODE if mode == "cached" else "recompute"):
                    if cache is None:
                        logits = model.recompute_step(seq)
                    elif i == 0:
                        logits = model.prefill(seq, cache)
                    else:
                        logits = model.decode_step(seq[:, -1:], cache)
                    nxt = sample_next(logits)
                seq = torch.cat((seq, nxt.cpu().to(seq.device)), dim=1)
                times.append((time.perf_counter() - t0) * 1000.0)
                peak = max(peak, self.memory.read().peak_allocated_bytes or 0)
            runs[mode] = (seq, times, peak, cache.nbytes() if cache is not None else 0)
        (c_seq, c_ms, c_peak, kv), (r_seq, r_ms, r_peak, _) = runs["cached"], runs["recompute"]
        later_c, later_r = c_ms[1:] or c_ms, r_ms[1:] or r_ms
        c50, r50 = percentile(later_c, 50), percentile(later_r, 50)
        self.session.emit(R.CACHE_BASELINE, self.session.step, {
            "tokens": n, "batch_size": self.config.batch_size,
            "prompt_len": self.config.prompt_len,
            "cached_ms_per_token_p50": c50, "recompute_ms_per_token_p50": r50,
            "cached_total_ms": sum(c_ms), "recompute_total_ms": sum(r_ms),
            "speedup": (r50 / c50) if c50 and r50 else None,
            "cached_peak_bytes": c_peak or None, "recompute_peak_bytes": r_peak or None,
            "kv_cache_bytes": kv, "same_tokens": bool(torch.equal(c_seq, r_seq)),
            "peak_note": ("per-step peaks of the allocator" if self.device.type == "cuda" else
                          "sampled heap peaks (mallinfo2), between blocks and at step ends")})
