"""The step split's forward and backward (hooks, probes/instruments/phases.py) against the
profiler's own clock on the same steps: a record_function around the model call and one around
``loss.backward()`` (issue 26). memtop's GPT on CPU, 10 plain steps then 10 profiled ones.

    python -m benchmarks run split_vs_profiler [--no-append]
"""

from __future__ import annotations

import statistics
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks.harness import Figure, in_thread, publish
from probes import Monitor
from probes.runfolder import METRICS, read_metrics
from trainer.model import GPT, GPTConfig

STEPS = 10
AGREE = 0.10  # the split's forward and backward within 10% of the profiler's


def measure() -> dict[str, float]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=128, block_size=64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randint(0, 256, (8, 64)), torch.randint(0, 256, (8, 64))
    spans: dict[str, list[float]] = {"fwd": [], "bwd": []}
    with tempfile.TemporaryDirectory() as tmp:
        with Monitor(model, opt, run_dir=tmp, listen=False, profiler=False, leak_watch=False,
                     ledger=False, write_report=False, warmup_steps=1) as mon:
            def step() -> None:
                with mon.step() as s:
                    with record_function("fwd"):
                        _, loss = model(x, y)
                    with record_function("bwd"):
                        loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    s.set(loss=loss)

            for _ in range(STEPS):
                step()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(STEPS):
                    step()
            for e in prof.events():
                if e.name in spans:
                    spans[e.name].append((e.time_range.end - e.time_range.start) / 1000.0)
            run = mon.run_dir
        rows, _, _ = read_metrics(run / METRICS)
    traced = rows[-STEPS:]
    return {"hooks_fwd": statistics.median(r["forward_ms"] for r in traced),
            "hooks_bwd": statistics.median(r["backward_ms"] for r in traced),
            "prof_fwd": statistics.median(spans["fwd"]),
            "prof_bwd": statistics.median(spans["bwd"])}


def options(ap) -> None:
    """No options of its own: 10 plain steps, then 10 profiled."""


def main(args) -> None:
    m = in_thread(measure)
    off = max(abs(m["hooks_fwd"] / m["prof_fwd"] - 1), abs(m["hooks_bwd"] / m["prof_bwd"] - 1))
    body = (f"memtop's GPT (2 layers, D=128, B=8, T=64), CPU, 1 thread; medians of the same "
            f"{STEPS} steps.\n\n"
            "| clock | forward | backward | backward / forward |\n|---|---|---|---|\n"
            f"| step split (hooks) | {m['hooks_fwd']:.2f} ms | {m['hooks_bwd']:.2f} ms | "
            f"{m['hooks_bwd'] / m['hooks_fwd']:.2f} |\n"
            f"| profiler (record_function) | {m['prof_fwd']:.2f} ms | {m['prof_bwd']:.2f} ms | "
            f"{m['prof_bwd'] / m['prof_fwd']:.2f} |")
    publish(args, "Issue 26: the step split against the profiler's clock", body, [Figure(
        "split_vs_profiler/agreement", "the step split's forward and backward against the "
        "profiler's record_function on the same steps", f"within {AGREE:.0%}",
        f"forward {m['hooks_fwd']:.2f} vs {m['prof_fwd']:.2f} ms, backward "
        f"{m['hooks_bwd']:.2f} vs {m['prof_bwd']:.2f} ms", "met" if off <= AGREE else "missed")])
