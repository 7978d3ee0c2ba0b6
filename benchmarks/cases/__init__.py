"""The cases, grouped by what they measure: one folder per area (its __init__ says what the
area measures), one module per case with ``options(parser)`` and ``main(args)``
(benchmarks/harness/cli.py). ``CASES`` declares each once: its name, its area, what it measures,
its target and how long it takes here; `python -m benchmarks list` prints them without
importing a case (no torch), `python -m benchmarks run NAME` runs one.

    from benchmarks.cases import find

    find("step_overhead").import_module()
"""

from __future__ import annotations

import difflib

from benchmarks.harness.cli import Case

__all__ = ["CASES", "all_cases", "find"]

CASES = (
    # step_cost/
    Case("overhead", "step_cost", "tokens/s of a plain AMP loop vs headless memtop, same process, "
         "interleaved pairs with same-run A/A noise; --side headless --runs N runs one side only "
         "(for py-spy)", "headless ≥ 0.99 × plain", "~3.5 min"),
    Case("step_overhead", "step_cost", "memtop's cost per step on one model in one process: blocks "
         "of plain and monitored steps interleaved, with plain/plain A/A (--model gpt: memtop's "
         "step; cnn: examples/own_loop.py, a 35 ms step; sweep: synthetic 1/3/10/30 ms steps), and "
         "the CPU of memtop's own threads",
         "≥ 0.99 (sweep: 0.95 at 1 ms, 0.99 at 3 ms, 0.995 at 10 and 30 ms)",
         "~7 min (cnn --pairs 200 --block 8: ~3 min)"),
    Case("monitor_overhead", "step_cost", "the public Monitor on your own loop: "
         "examples/own_loop.py's CNN plain vs monitored, separate runs interleaved with A/A",
         "≥ 0.99 × plain", "~4 min"),
    Case("monitor_fixed_cost", "step_cost", "the Monitor's own work per step on a 4×4 Linear "
         "(plain and monitored blocks interleaved), one mallinfo2 heap read, a step around no "
         "torch work; --split: the step split's own cost; --breakdown: cProfile of the step path",
         "≤ 50 µs per step; the split ≤ 10 µs", "~15 s"),
    Case("cuda_hot_path", "step_cost", "the CUDA step path's Python overhead without a GPU (issue "
         "45): the split on the event clock over stand-in events, the device-index lookups the old "
         "path made, the step's values through stack+tolist vs StepValueReader, a whole monitored "
         "step on the event clock", "the Monitor's step ≤ 100 µs on a GPU (≤ 50 the goal)",
         "~1 min"),
    Case("sampler_cost", "step_cost", "µs per probe and per whole step sample after training (a "
         "realistic heap), beside psutil / torch.cuda.memory_stats() / NVML",
         "whole sample ≤ 20 µs", "~1 min"),
    Case("sampler_in_run", "step_cost", "the two memory reads the trainer makes each step, timed "
         "inside a live run", "≤ 20 µs per step together", "~1 min"),
    Case("workers_sampler", "step_cost", "the DataLoader workers' sampler (issue 43): its "
         "thread's CPU at 1 Hz and ms a reading with 0, 2 and 8 live workers; the default GPT "
         "fed by 2 workers with the sampler on vs off, interleaved [off, on, off'] with A/A",
         "the thread ≤ a few % of a core (5% at 8 workers); on / off ≥ 0.99, inside the A/A noise",
         "~7 min (part 1 ~2 min: 3 × 3 rounds of 10 s)"),
    # ui/
    Case("dashboard_overhead", "ui", "tokens/s with `memtop train` drawing in a real terminal "
         "(tmux 80x24, 120x40, 200x60) vs --headless, separate processes, interleaved pairs with "
         "headless/headless A/A; UI-thread and tmux CPU; --diagnose: gc pauses and py-spy --gil",
         "dashboard ≥ 0.98 × headless at every size", "~15 min"),
    Case("ui_latency", "ui", "key-to-redraw latency p50/p95 and the longest event-loop stall while "
         "training, split by profiler phase, in process; then end to end in tmux",
         "p95 ≤ 100 ms; longest stall ≤ 100 ms", "~5 min"),
    Case("ui_growth", "ui", "what the dashboard keeps growing: tracemalloc diff over a run with "
         "`?` pressed, Footer watchers, unfrozen gc objects (finds sites; prints only)",
         "none (a finder; memory_soak holds the target)", "~3 min"),
    Case("view_cost", "ui", "`memtop view`: time to open a 100,000-step run in tmux, and the "
         "viewer's CPU while following a live run", "open ≤ 2 s; following ≤ 2% of a core",
         "~3 min"),
    # startup/
    Case("startup", "startup", "command to the dashboard's frame and to its first sample on screen "
         "(tmux), headless first line / first step line, with `import torch`, a bare Textual app "
         "and a bare training script as baselines",
         "frame ≤ 0.6 s; first sample ≤ the bare script's first loss + 0.2 s", "~2 min"),
    # memory/
    Case("memory_soak", "memory", "memtop's own RSS over a 100,000-step headless run and a "
         "10-minute dashboard run of a tiny config (`?` and `p` pressed meanwhile); --steps, "
         "--dash-minutes shorten it",
         "headless < 5 MiB growth after warm-up; dashboard < 2 MiB after its first 2 minutes",
         "~50 min (100k tiny steps take ~35 min here)"),
    # leaks/
    Case("leak_detection", "leaks", "the leak detector on the default CPU run: false alarms on "
         "healthy runs (a pause, profiler windows), steps to alert on the graph and logits leaks "
         "and to clear after the fix",
         "alert ≤ 10 (graph) / ≤ 5 (logits) steps; clear ≤ 20; 0 false alarms", "~8 min"),
    Case("culprit_pause", "leaks", "how long the culprit finder pauses the training thread (both "
         "looks) by live Python objects, on real leaks with ballast objects beside them",
         "≤ 1 s at 10⁶ objects", "~3 min"),
    Case("time_to_full", "leaks", "every leak_forecast ETA of a real leaking run against the time "
         "RSS reached --max-memory (the guard's stop)", "error ≤ 25% (|ETA − actual| / actual)",
         "~1 min at --max-memory 1GiB; ~10 min at 6GiB"),
    # ranks/
    Case("ranks_overhead", "ranks", "per-rank tokens/s of a plain 2-rank DDP loop (gloo, CPU) vs "
         "`memtop train --nproc 2`, separate torchrun launches in interleaved rounds with A/A; "
         "--model JSON sets the size (e.g. '{\"amp\": \"off\"}' on a CPU without native bf16)",
         "≥ 0.99 × plain per rank", "~10 min"),
    # frameworks/
    Case("framework_overhead", "frameworks", "the same HF Trainer (--framework hf) or Lightning "
         "Trainer (--framework lightning) with and without MemtopCallback, one train()/fit() per "
         "side in one process, interleaved [without, with, without'] with A/A; optimizer steps/s "
         "after --skip steps", "with ≥ 0.99 × without", "~3 min per framework"),
    # inference/
    Case("inference", "inference", "`memtop infer --headless` on defaults in a subprocess: wall "
         "time of the whole command, TTFT and decode p50/p95, tokens/s per phase, the KV cache "
         "measured vs its formula, the cache-off baseline", "the whole command < 1 min", "~2 min"),
    # export/
    Case("metrics_scrape", "export", "training tokens/s with and without 100 scrapes a second: "
         "--metrics-port in the process, `memtop metrics` beside the run, and the control: a "
         "static endpoint scraped the same way; rounds [plain, in-process, exporter, static, "
         "plain'] with A/A; one kept connection (--new-connection: one per scrape); every "
         "scrape's answer checked", "each ≥ 0.99 × plain, no scrape error", "~8 min"),
    Case("kill9_loss", "export", "what a kill -9 takes from metrics.jsonl: a child publishing a "
         "row every ~1 ms through memtop's writer, killed at random moments",
         "at most the last ~0.5 s of rows (the flush interval)", "~30 s"),
    # attribution/
    Case("attribution_window", "attribution", "a memory attribution window's measured step against "
         "a plain step of the same run, and runs with the hook never opened against runs without "
         "it (interleaved, A/A)",
         "window step ≤ 2× a plain step; the hook unopened ≥ 0.98 (inside the A/A noise)",
         "~15 min"),
    Case("ledger_cost", "attribution", "the memory ledger: one measured step against plain steps "
         "of the same run, and amortised over its sampling interval",
         "amortised within ~1% of a step", "~2 min"),
    # fit/
    Case("fit_accuracy", "fit", "`memtop fit` (issue 41): the predicted peak's error at 2×, 4× "
         "and 8× the probe's B and T, each size checked in a fresh process, and the whole "
         "command's wall time on the default model", "errors within ±10%; `memtop fit` < 60 s "
         "on 2 cores", "~3 min (one repeat ~1 min: 8 fresh processes)"),
    # profiler/
    Case("profiler_window", "profiler", "step time inside vs outside a profiler window (three "
         "analysis modes), the training time a window costs, and how late a UI-like thread wakes "
         "while it ends and is analysed",
         "the UI-like stall ≤ 100 ms (memtop's mode: the table computed by a child process)",
         "~7 min"),
    Case("profiler_gil_holds", "profiler", "how long the profiler window's two C++ calls (the "
         "schedule's stop, export_chrome_trace) hold the GIL, seen by a thread ticking every 1 ms",
         "each ≤ 100 ms (the UI's stall budget)", "~1 min"),
    Case("split_vs_profiler", "profiler", "the step split's forward and backward (hooks) against "
         "the profiler's record_function clock on the same steps",
         "forward and backward within 10% of the profiler's", "~30 s"),
)


def all_cases() -> list[Case]:
    """Every case, area by area."""
    return list(CASES)


def find(name: str) -> Case:
    """The case of that name; a KeyError that names the nearest ones."""
    cases = {c.name: c for c in CASES}
    if name in cases:
        return cases[name]
    near = difflib.get_close_matches(name, list(cases), n=3)
    raise KeyError(f"no case {name!r}" + (f" (did you mean {', '.join(near)}?)" if near else
                                          "; `python -m benchmarks list` lists them"))
