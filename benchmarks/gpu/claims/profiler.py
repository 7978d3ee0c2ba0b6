"""GPU claims about the profiler window on CUDA and the host syncs of a step: the top-ops table
from trace.json against torch's key_averages() of the same window, the device ranking, the
device-time reconciliation, and syncs per step counted with set_sync_debug_mode."""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import warnings
from typing import Any

import torch

from benchmarks.gpu.registry import Ctx, Outcome, claim
from benchmarks.harness import in_thread
from probes.instruments.hooks import StepHook
from probes.records import StepSample


# ---- the profiler window ----------------------------------------------------------------------
def _key(name: str, on_device: bool, annotation: bool) -> tuple[str, bool, bool]:
    """How key_averages() keys its rows (name, device type, user annotation): a labelled range
    has a CPU row and, on CUDA, a gpu_user_annotation row of the same name."""
    return (name, on_device, annotation)


def profiler_run(ctx: Ctx) -> dict[str, Any]:
    """memtop's default model with --profile-at 8, its window's own key_averages() kept; plain
    data only (the profiler and the model are gone when this returns)."""
    def make() -> dict[str, Any]:
        from probes.monitor import default_hooks
        from probes.traces.chrome_trace import load_trace, read_ops

        cfg = ctx.config(steps=22, profile_at=[8])
        hooks = default_hooks(**cfg.hook_options())
        window = next(h for h in hooks if hasattr(h, "open_window"))
        window.keep_profiler = True
        run = ctx.train("profiler_window", cfg, timeout_s=150, own_hooks=hooks)
        done = run.events("profile_done")
        if len(done) != 1:
            raise RuntimeError(f"{len(done)} profile_done events; cancelled: "
                               f"{[e.data for e in run.events('profile_cancelled')]}")
        prof, window.last_profiler = window.last_profiler, None
        theirs = {}
        if prof is not None:
            for e in in_thread(prof.key_averages):
                on_device = getattr(getattr(e, "device_type", None), "name", "CPU") != "CPU"
                theirs[_key(e.key, on_device, bool(e.is_user_annotation))] = {
                    "calls": e.count, "self_device_us": float(e.self_device_time_total)}
        del prof, hooks, window
        trace_path = run.run_dir / done[0].data["dir"] / "trace.json"
        trace = load_trace(trace_path)
        ops = read_ops(trace)
        cats: dict[str, int] = {}
        for ev in trace.get("traceEvents", []):
            cats[str(ev.get("cat"))] = cats.get(str(ev.get("cat")), 0) + 1
        return {"done": done[0].data, "ours": ops.rows, "theirs": theirs,
                "device": ops.device, "cats": cats, "trace": str(trace_path)}

    return ctx.shared("profiler_window", make)


@claim(group="profiler", needs_s=30, priority=20)
def ops_table_equals_key_averages(ctx: Ctx) -> Outcome:
    """the top-ops table read from trace.json has the rows of torch's key_averages() of the same
    CUDA window, keyed as torch keys them (name, device or CPU, user annotation), with equal
    calls and self device time (±1 µs or 1%)"""
    data = profiler_run(ctx)
    theirs = data["theirs"]
    if not theirs:
        return Outcome.check(False, "the window kept no profiler")
    ours = {_key(r["name"], r["on_device"], r["user_annotation"]): r for r in data["ours"]}
    bad = []
    for key, row in ours.items():
        ref = theirs.get(key)
        if ref is None or row["calls"] != ref["calls"] or abs(
                (row["self_device_us"] or 0.0) - ref["self_device_us"]) > max(
                1.0, 0.01 * ref["self_device_us"]):
            bad.append(f"{key[0]}{' (device)' if key[1] else ''}: ours "
                       f"{row['calls']}×/{row['self_device_us']} µs, torch "
                       f"{ref and (ref['calls'], ref['self_device_us'])}")
    only_theirs = sorted(k[0] for k in set(theirs) - set(ours))
    ok = not bad and not only_theirs
    return Outcome.check(ok, f"{len(ours)} rows vs torch's {len(theirs)}; differing: "
                             f"{bad[:4]}; only in torch's: {only_theirs[:4]}",
                         differing=bad[:40], only_in_torch=only_theirs[:40])


@claim(group="profiler", needs_s=30, priority=20)
def no_annotation_in_device_ranking(ctx: Ctx) -> Outcome:
    """the window's table, sorted by device time, holds no
    ProfilerStep#/forward/backward/optimizer span, and its top op is among torch's top 3 ops by
    self device time"""
    data = profiler_run(ctx)
    rows = data["done"].get("top_ops") or []
    ranked = [k[0] for k, v in sorted(data["theirs"].items(),
                                      key=lambda kv: -kv[1]["self_device_us"]) if not k[2]]
    ann = [r["name"] for r in rows if r.get("user_annotation")]
    ok = (bool(rows) and data["done"].get("sort_by") == "device" and not ann
          and rows[0]["name"] in ranked[:3])
    return Outcome.check(ok, f"sorted by {data['done'].get('sort_by')}; memtop top "
                             f"{[r['name'] for r in rows[:3]]}; torch top {ranked[:3]}; "
                             f"annotations in the ranking: {ann}")


@claim(group="profiler", needs_s=30, priority=20)
def ops_table_reconciles_on_cuda(ctx: Ctx) -> Outcome:
    """on the window's real CUDA trace the device time launched by CPU ops plus the unattributed
    rest equals the trace's kernel + memcpy + memset time, and under 5% of it is unattributed"""
    data = profiler_run(ctx)
    dev = data["device"]
    if dev is None:
        return Outcome.check(False, f"no device events in trace.json ({data['cats']})")
    sums = abs(dev.launched_us + dev.unattributed_us - dev.total_us) < 1e-3
    event_dev = (data["done"].get("device_time") or {}).get("total_us")
    ok = sums and dev.total_us > 0 and dev.unattributed_us <= 0.05 * dev.total_us
    return Outcome.check(ok, dev.line() + f"; profile_done says {event_dev} µs",
                         device_time=dataclasses.asdict(dev))


# ---- syncs per step ----------------------------------------------------------------------------
def per_step_counts(marks: dict[int, int]) -> dict[int, int]:
    """Counts between successive step starts: ``marks[step]`` is the running total seen when
    ``step`` began, so step s owns ``marks[s + 1] - marks[s]`` (its end-of-step read included)."""
    steps = sorted(marks)
    return {s: marks[n] - marks[s] for s, n in zip(steps, steps[1:], strict=False)}


def agreement(wall_ms: list[float], device_ms: list[float]) -> dict[str, float] | None:
    """Median ratio of memtop's step time to the CUDA-event time of the same steps."""
    pairs = [(w, d) for w, d in zip(wall_ms, device_ms, strict=True) if d > 0]
    if not pairs:
        return None
    ratios = [w / d for w, d in pairs]
    return {"median_ratio": statistics.median(ratios), "min_ratio": min(ratios),
            "max_ratio": max(ratios), "steps": len(pairs)}


def is_sync_warning(w: Any) -> bool:
    return "synchroniz" in str(w.message).lower()


class SyncCounter(StepHook):
    """Counts torch's sync-debug warnings per step and records CUDA events at each step's start
    and end. Both are taken on the training thread at the step's own moments: the count of
    sync warnings seen so far when each step begins (``marks``), read from the live list that
    ``sync_warnings`` fills, and the end event in ``end_step`` (not batched: right after the
    step's row is built, its one read done), with memtop's step_ms of that row.

    The first H200 run read both too late (issue 45): the marks from a list filled only when
    the run ended (every step counted 0 syncs), the end event from a sink, which gets a run's
    rows in batches (up to 8 steps later: CUDA-event time 2.6 times memtop's)."""

    def __init__(self, live: list[Any] | None = None) -> None:
        self.live: list[Any] = live if live is not None else []  # sync_warnings' list
        self._scanned = 0
        self._syncs = 0
        self.marks: dict[int, int] = {}
        self.events: dict[int, tuple[Any, Any]] = {}
        self.wall_ms: dict[int, float] = {}
        self.clock: dict[int, bool] = {}  # step -> its row timed that step on the device

    def syncs_so_far(self) -> int:
        live = self.live
        while self._scanned < len(live):
            self._syncs += is_sync_warning(live[self._scanned])
            self._scanned += 1
        return self._syncs

    @contextlib.contextmanager
    def step_context(self, step: int):
        self.marks[step] = self.syncs_so_far()
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        self.events[step] = (start, None)
        yield

    def end_step(self, step: int, tensors: Any, record: StepSample) -> None:
        if step in self.events:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.events[step] = (self.events[step][0], end)
            self.wall_ms[step] = record.step_ms
            self.clock[step] = record.split_step == step

    def device_ms(self) -> dict[int, float]:
        torch.cuda.synchronize()
        return {s: a.elapsed_time(b) for s, (a, b) in self.events.items() if b is not None}


@contextlib.contextmanager
def sync_warnings():
    """Every warning of every thread, live, in the list this yields (sync-debug mode "warn"
    on meanwhile; ``is_sync_warning`` picks torch's sync warnings), then mode 0."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield caught
        finally:
            torch.cuda.set_sync_debug_mode(0)


def plain_sync_count(cfg: Any, fused: bool, steps: int = 8) -> list[int]:
    """Calibration: a plain fp16 loop (loss.item() per step) counted the same way; a non-fused
    AdamW must show one more sync per step (GradScaler's found-inf .item()) than a fused one."""
    from trainer.data import BatchSampler, load_corpus
    from trainer.model import GPT

    device = cfg.torch_device
    model = GPT(cfg.model_config()).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    scaler = torch.amp.GradScaler("cuda")
    batches = BatchSampler(load_corpus(), cfg.batch_size, cfg.seq_len, cfg.seed, device)
    counts: list[int] = []
    for _ in range(steps):
        x, y = batches.next_batch()
        with sync_warnings() as caught:
            with torch.autocast("cuda", dtype=torch.float16):
                _, loss = model(x, y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            loss.item()
        counts.append(sum(map(is_sync_warning, caught)))
    return counts


def sync_run(ctx: Ctx) -> dict[str, Any]:
    def make() -> dict[str, Any]:
        cfg = ctx.config(amp="fp16", steps=30)
        with sync_warnings() as caught:
            counter = SyncCounter(caught)
            # the last step has no next start: it is not counted (its end is the run's close,
            # weights saved to the host, the claim's free_device: syncs that are not a step's)
            run = ctx.train("sync_count", cfg, hooks=[counter])
        counts = per_step_counts(counter.marks)
        timed = [s for s in sorted(counter.wall_ms) if s > cfg.warmup_steps]
        dev_ms = counter.device_ms()
        out = {"memtop": [c for s, c in counts.items() if s > cfg.warmup_steps],
               "fused": plain_sync_count(cfg, fused=True),
               "unfused": plain_sync_count(cfg, fused=False),
               "agreement": agreement([counter.wall_ms[s] for s in timed],
                                      [dev_ms.get(s, 0.0) for s in timed]),
               "device_clock_rows": sum(counter.clock.get(s, False) for s in timed),
               "timed_rows": len(timed),
               "sample": [str(w.message)[:160] for w in caught if is_sync_warning(w)][:3],
               "exit_code": run.exit_code}
        del counter
        return out

    return ctx.shared("sync_count", make)


@claim(group="syncs", needs_s=20, priority=25)
def sync_counting_works(ctx: Ctx) -> Outcome:
    """set_sync_debug_mode counts one more sync per step for a non-fused AdamW under GradScaler
    than for a fused one (the counting is calibrated)"""
    d = sync_run(ctx)
    ok = statistics.median(d["unfused"]) == statistics.median(d["fused"]) + 1
    return Outcome.check(ok, f"plain loop: fused {d['fused']}, non-fused {d['unfused']} syncs "
                             "per step")


@claim(group="syncs", needs_s=20, priority=25)
def one_sync_per_step(ctx: Ctx) -> Outcome:
    """memtop's fp16 trainer (fused AdamW: GradScaler hands it the found-inf flag as a tensor)
    makes exactly one host sync per step after warmup, the one wait for the step's loss, grad
    norm and scale (probes/monitor/stepvalues.py: pinned copies, one stream synchronize); the
    step split's CUDA events are queried, never synchronised. Counted with set_sync_debug_mode
    per step, on the training thread"""
    d = sync_run(ctx)
    calibrated = statistics.median(d["unfused"]) == statistics.median(d["fused"]) + 1
    med = statistics.median(d["memtop"]) if d["memtop"] else None
    return Outcome.check(med == 1 and calibrated and d["exit_code"] == 0,
                         f"median {med} per step (max {max(d['memtop'], default=None)}); "
                         f"counting calibrated: {calibrated}", per_step=d["memtop"],
                         warning_sample=d["sample"])


@claim(group="syncs", needs_s=20, priority=25)
def step_time_matches_cuda_events(ctx: Ctx) -> Outcome:
    """memtop's step_ms agrees with CUDA events recorded around the same steps by an instrument
    of the claim's own (start in the step's context, end right after its row) within 10% (median
    ratio), and every row after warmup is on the device clock (its own step measured)"""
    d = sync_run(ctx)
    agree = d["agreement"]
    if agree is None:
        return Outcome.check(False, "no CUDA event times")
    clocked = d["device_clock_rows"] == d["timed_rows"] > 0
    return Outcome.check(0.9 <= agree["median_ratio"] <= 1.1 and clocked,
                         f"step_ms / CUDA-event median ratio {agree['median_ratio']:.3f} "
                         f"({agree['min_ratio']:.3f}–{agree['max_ratio']:.3f}, "
                         f"{agree['steps']} steps); rows on the device clock "
                         f"{d['device_clock_rows']}/{d['timed_rows']}", **agree)
