"""GPU claims about the leak detector on CUDA: the two demo leaks (logits kept on the device, the
`l` key's graph demo) raise their alert and clear, and a graph kept on the host is seen on the
host heap there too."""

from __future__ import annotations

from typing import Any

from benchmarks.gpu.registry import Ctx, Outcome, claim


def logits_leak(ctx: Ctx) -> dict[str, Any]:
    """--leak logits from step 20 to 45: each step's logits kept on the device."""
    def make() -> dict[str, Any]:
        cfg = ctx.config(steps=70, leak="logits", leak_at=20, leak_stop_at=45)
        run = ctx.train("leak_logits", cfg, timeout_s=120)
        per_elem = 2 if cfg.amp_mode in ("fp16", "bf16") else 4
        return {"alerts": [(e.step, e.data.get("counter"), e.data.get("bytes_per_step"))
                           for e in run.events("leak_suspected")],
                "cleared": [(e.step, e.data.get("counter")) for e in run.events("leak_cleared")],
                "expected": cfg.batch_size * cfg.seq_len * 256 * per_elem}

    return ctx.shared("leak_logits", make)


@claim(group="leaks", needs_s=25, priority=45)
def logits_leak_alert_on_device(ctx: Ctx) -> Outcome:
    """the logits leak (B×T×V half-precision logits kept each step) raises leak_suspected on
    device_allocated within 10 steps, at 0.5–2× the logits' bytes per step"""
    d = logits_leak(ctx)
    mine = [a for a in d["alerts"] if a[1] == "device_allocated"]
    if not mine:
        return Outcome.check(False, f"no alert on device_allocated: {d['alerts']}")
    step, _, rate = mine[0]
    ok = step - 20 <= 10 and 0.5 * d["expected"] <= (rate or 0) <= 2 * d["expected"]
    return Outcome.check(ok, f"alert {step - 20} steps after the leak began, {rate:,.0f} B/step "
                             f"(logits {d['expected']:,} B)", alerts=d["alerts"])


@claim(group="leaks", needs_s=25, priority=45)
def logits_leak_cleared(ctx: Ctx) -> Outcome:
    """the device_allocated alert clears after the leak is stopped"""
    d = logits_leak(ctx)
    done = [c for c in d["cleared"] if c[1] == "device_allocated" and c[0] >= 45]
    return Outcome.check(bool(done), f"cleared {done[0][0] - 45} steps after the fix" if done
                         else f"not cleared: {d['cleared']}", cleared=d["cleared"])


@claim(group="leaks", needs_s=20, priority=46)
def graph_leak_alert_on_cuda(ctx: Ctx) -> Outcome:
    """the `l` key's graph demo on CUDA (its backward retains the graph and the loss is kept:
    the saved activations stay on the device, as real graph leaks there do; trainer/leaks.py)
    raises leak_suspected within 10 steps"""
    run = ctx.train("leak_graph", ctx.config(steps=40, leak="graph", leak_at=20))
    alerts = [(e.step, e.data.get("counter"), e.data.get("bytes_per_step"))
              for e in run.events("leak_suspected")]
    started = [e.data.get("hint") for e in run.events("leak_demo_started")]
    first = alerts[0] if alerts else None
    ok = first is not None and first[0] - 20 <= 10
    return Outcome.check(ok, f"first alert {first}, {first[0] - 20} steps after the demo began"
                         if first else "no alert", alerts=alerts, demo_hint=started)


@claim(group="leaks", needs_s=25, priority=46)
def host_heap_leak_alert_on_cuda(ctx: Ctx) -> Outcome:
    """a graph kept after an ordinary backward (examples/leaky_loops.py's graph loop: ~512
    B/step of device memory, its autograd nodes on the host) raises leak_suspected on host_heap
    on CUDA: the host heap is watched there at its budgeted rate (probes/counters/memory.py)"""
    from benchmarks.gpu.claims.culprits import culprit_run

    d = culprit_run(ctx, "graph", steps=60)
    alerts = [(a.get("step"), a.get("counter"), a.get("bytes_per_step")) for a in d["alerts"]]
    host = [a for a in alerts if a[1] == "host_heap"]
    return Outcome.check(bool(host), f"first host_heap alert {host[0]}" if host else
                         f"no host_heap alert: {alerts}", alerts=alerts)
