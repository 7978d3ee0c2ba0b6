"""Dashboard overhead: training tokens/s with `memtop train` drawing in a real terminal vs headless.

    python -m benchmarks run dashboard_overhead [--pairs 7] [--steps 400] [--skip 20] [--no-append]

Each run is a separate `python -m tui.cli train` process on the default config (the dashboard's
B, T, model, bf16 on CPU). The dashboard runs in a real terminal: a tmux pane (its own tmux server,
detached, so tmux parses every byte the app writes, as it would for an SSH client), at 120x40 and
80x24 and 200x60; headless runs as a plain subprocess. Rounds [headless, each size,
headless'] (odd rounds reversed) give each size's ratio to the round's headless run and the
A/A noise headless'/headless of the same round (benchmarks/harness/pairs.py). tokens/s = tokens of
the steps after --skip divided by the wall time between those two step rows of metrics.jsonl
(a per-step median would hide the cost: only the steps that overlap a frame slow down). Also
reported: CPU time of the app's main (UI) thread and of the tmux server over the same interval.

One run of either side (and the metrics.jsonl readers) is benchmarks/harness/runs.py; the tmux
pane and memtop's command lines benchmarks/harness/terminal.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.harness import (
    RATIO_HEADER,
    ROOT,
    load_avg,
    median,
    publish,
    run_pairs,
    top_cpu,
    wait_quiet,
)
from benchmarks.harness.runs import run_dashboard, run_headless, tmux_version
from benchmarks.harness.terminal import TINY, TmuxPane, apply_run_options

TARGET = 0.98



# ---- --diagnose: where the dashboard's cost goes -------------------------------------------------

def summarize_gc(path: Path, start: float, end: float) -> dict:
    """gc pauses inside [start, end] (wall clock): count, total and longest per generation."""
    data = json.loads(path.read_text())
    out: dict = {"switch_interval_ms": data["switch_interval"] * 1000, "frozen": data["frozen"]}
    span = end - start
    for gen in (0, 1, 2):
        ev = [e for e in data["gc"] if e[1] == gen and start <= e[0] <= end]
        out[f"gen{gen}"] = {"n_per_s": len(ev) / span,
                            "ms_per_s": 1000 * sum(e[2] for e in ev) / span,
                            "max_ms": 1000 * max((e[2] for e in ev), default=0.0),
                            "threads": sorted({e[3] for e in ev})}
    return out


def summarize_spy(path: Path, top: int = 8) -> dict:
    """py-spy --gil --threads raw output: share of GIL-holding samples per thread, and the
    heaviest stacks of the UI (main) thread, cut to their last frames."""
    per_thread: dict[str, int] = {}
    main_stacks: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        thread = frames[0].split(":", 1)[-1].strip() or frames[0]
        per_thread[thread] = per_thread.get(thread, 0) + n
        total += n
        if thread == "MainThread":
            key = " < ".join(f.split(" (")[0] for f in reversed(frames[-4:]))
            main_stacks[key] = main_stacks.get(key, 0) + n
    return {"samples": total,
            "gil_share": {t: n / total for t, n in sorted(per_thread.items(),
                                                          key=lambda kv: -kv[1])} if total else {},
            "main_top": sorted(main_stacks.items(), key=lambda kv: -kv[1])[:top]}


def diagnose(args) -> str:
    """One headless and one 120x40 dashboard run with gc pauses logged and py-spy (--gil:
    which thread holds the GIL) attached for --spy-seconds after step --skip."""
    spy = shutil.which("py-spy")
    parts = []
    for side in ("headless", "dashboard 120x40"):
        wait_quiet(args.max_busy, args.max_wait, f"before {side} (diagnose)")
        with tempfile.TemporaryDirectory(prefix="memtop-diag-") as tmp:
            gc_log, spy_out = str(Path(tmp) / "gc.json"), Path(tmp) / "spy.txt"
            procs: list[subprocess.Popen] = []

            def attach(pid: int, procs=procs, spy_out=spy_out) -> None:
                if spy:
                    procs.append(subprocess.Popen(
                        [spy, "record", "--pid", str(pid), "--duration", str(args.spy_seconds),
                         "--rate", "200", "--gil", "--threads", "--nonblocking", "-f", "raw",
                         "-o", str(spy_out)], stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL))

            if side == "headless":
                res = run_headless(args.steps, args.skip, 1200, gc_log=gc_log, on_start=attach)
            else:
                res = run_dashboard(120, 40, args.steps, args.skip, 1200, gc_log=gc_log,
                                    on_start=attach)
            for p in procs:
                p.wait(60)
            g = summarize_gc(Path(gc_log), res["start_wall"], res["end_wall"])
            sp = summarize_spy(spy_out) if spy_out.exists() else None
        gcs = "; ".join(f"gen{i}: {g[f'gen{i}']['n_per_s']:.1f}/s, {g[f'gen{i}']['ms_per_s']:.1f}"
                        f" ms/s, max {g[f'gen{i}']['max_ms']:.1f} ms "
                        f"({', '.join(g[f'gen{i}']['threads']) or '-'})" for i in (0, 1, 2))
        text = (f"**{side}**: {res['tokens_per_s']:,.0f} tok/s (py-spy attached for "
                f"{args.spy_seconds} s of it); main-thread CPU "
                f"{res.get('main_thread_cpu_pct', float('nan')):.1f}%, others "
                f"{res.get('others_cores', float('nan')):.2f} cores. gc (frozen objects "
                f"{g['frozen']:,}, switch interval {g['switch_interval_ms']:.0f} ms): {gcs}.")
        if sp:
            share = ", ".join(f"{t} {v:.1%}" for t, v in list(sp["gil_share"].items())[:5])
            text += f" GIL-holding samples ({sp['samples']}): {share}."
            if side != "headless":
                text += " Main thread's heaviest GIL-holding stacks (leaf first): " + "; ".join(
                    f"{n}× `{k[:140]}`" for k, n in sp["main_top"])
        elif not spy:
            text += " (py-spy not installed: `pip install py-spy` for the GIL split)"
        print(text, flush=True)
        parts.append(text)
    return "\n\n".join(parts)


def refresh_rate() -> tuple[float, float]:
    """REFRESH_S and CHART_EVERY_S as tui/app.py defines them (read from source: no import)."""
    text = (ROOT / "tui" / "app.py").read_text(encoding="utf-8")
    refresh = float(re.search(r"^REFRESH_S\s*=\s*([\d.]+)", text, re.M).group(1))
    chart = float(re.search(r"^CHART_EVERY_S\s*=\s*([\d.]+)", text, re.M).group(1))
    return refresh, chart


def options(ap) -> None:
    ap.pairs(7, "headless, every size, headless'")
    ap.add_argument("--steps", type=int, default=400, help="steps per run (~25 s here)")
    ap.add_argument("--skip", type=int, default=20, help="first steps left out")
    ap.add_argument("--sizes", default="80x24,120x40,200x60", help="terminal sizes, WxH,...")
    ap.quiet(max_wait=900)
    ap.smoke()
    ap.add_argument("--diagnose", action="store_true",
                    help="instead: one headless + one dashboard run with gc pauses logged "
                         "and py-spy --gil attached (where the cost goes)")
    ap.add_argument("--spy-seconds", type=int, default=20)
    ap.amp()


def main(args) -> None:
    apply_run_options(args)
    if args.diagnose:
        body = diagnose(args)
        TmuxPane.kill_server()
        refresh_s, _ = refresh_rate()
        publish(args, "Dashboard overhead: where the cost goes (gc, GIL)",
                f"Default config, {args.steps} steps per run, dashboard refresh "
                f"{1 / refresh_s:g} Hz.\n\n{body}")
        return
    from trainer.config import TrainConfig

    defaults = TrainConfig(device="cpu", run_dir=tempfile.gettempdir())  # `memtop train`'s
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    runs: dict[str, list[dict]] = {}
    rejected: list[str] = []
    timeout = max(600.0, args.steps * 2.0)

    def side_fn(side: str):
        def run_once() -> tuple[float, float]:
            for attempt in range(3):
                wait_quiet(args.max_busy, args.max_wait, f"before {side}")
                load = load_avg()
                try:
                    if side == "headless":
                        res = run_headless(args.steps, args.skip, timeout)
                    else:
                        w, h = (int(v) for v in side.split()[1].split("x"))
                        res = run_dashboard(w, h, args.steps, args.skip, timeout)
                except RuntimeError as exc:  # e.g. the tree is being edited: try again later
                    if attempt == 2:
                        raise
                    print(f"  {side} failed ({str(exc)[-300:]}); again in 60 s", flush=True)
                    rejected.append(f"{side} (failed: {str(exc).splitlines()[0][:80]})")
                    time.sleep(60)
                    continue
                if res.get("others_cores", 0.0) <= args.max_busy or attempt == 2:
                    break
                print(f"  {side}: other processes used {res['others_cores']:.2f} cores during "
                      f"the run ({top_cpu()}); run again ({attempt + 1}/3)", flush=True)
                rejected.append(f"{side} ({res['tokens_per_s']:,.0f} tok/s, others "
                                f"{res['others_cores']:.2f} cores)")
            res["load_before"] = load
            runs.setdefault(side, []).append(res)
            print(f"  {side:>18}: {res['tokens_per_s']:8,.0f} tok/s over {res['steps']} steps /"
                  f" {res['wall_s']:.1f} s; main thread "
                  f"{res.get('main_thread_cpu_pct', float('nan')):.1f}% CPU, tmux "
                  f"{res.get('tmux_cpu_pct', float('nan')):.1f}%, others "
                  f"{res.get('others_cores', float('nan')):.2f} cores; load {load}", flush=True)
            return res["tokens_per_s"], res.get("others_cores", 0.0)
        return run_once

    sides = {"headless": side_fn("headless")}
    for w, h in sizes:
        sides[f"dashboard {w}x{h}"] = side_fn(f"dashboard {w}x{h}")
    pairs = run_pairs(args, "headless", sides, wait=False, show=False)
    TmuxPane.kill_server()
    refresh_s, chart_s = refresh_rate()
    rows, verdicts, figures = [], [], []
    for side in pairs.ratios:
        row, v = pairs.row(side, f"{side} / headless, tokens/s", TARGET)
        rows.append(row)
        verdicts.append(f"{side}: {v}")
        size = side.split()[1]
        figures.append(pairs.figure(f"dashboard_overhead/{size}", f"the dashboard drawing in "
                                    f"a real terminal at {size} / headless, tokens/s", side,
                                    TARGET))
    cpu_lines = ["| side | tokens/s median | main-thread CPU (median) | tmux CPU (median) | "
                 "all runs (tok/s) |", "|---|---|---|---|---|"]
    for side, rs in runs.items():
        vals = [r["tokens_per_s"] for r in rs]
        main_cpu = median([r.get("main_thread_cpu_pct", float("nan")) for r in rs])
        tmux_cpu = [r["tmux_cpu_pct"] for r in rs if "tmux_cpu_pct" in r]
        cpu_lines.append(f"| {side} | {median(vals):,.0f} | {main_cpu:.1f}% | "
                         f"{f'{median(tmux_cpu):.1f}%' if tmux_cpu else ''} | "
                         f"{', '.join(f'{v:,.0f}' for v in vals)} |")
    table = RATIO_HEADER + "\n" + "\n".join(rows) + "\n\n" + "\n".join(cpu_lines)
    body = (
        f"Config: `memtop train` defaults (B={defaults.batch_size}, T={defaults.seq_len}, "
        f"{defaults.layers} layers, dim {defaults.dim}, "
        f"explicit attention, amp {args.amp}, CPU)"
        f"{' with --smoke: ' + ' '.join(TINY) if args.smoke else ''}"
        f", {args.steps} steps per run, tokens/s over steps "
        f"{args.skip}..{args.steps} from metrics.jsonl time_s (tokens ÷ wall time). Dashboard "
        f"refresh {1 / refresh_s:g} Hz (tui/app.py REFRESH_S = {refresh_s}), memory chart "
        f"rebuilt every {chart_s:g} s or less often on big panes. Each run is its own process: "
        f"headless = `python -m tui.cli train --headless`, dashboard = `python -m tui.cli "
        f"train` in a detached tmux {tmux_version()} pane of the given size, quit with q after "
        f"the last step row. {args.pairs} rounds of [headless, dashboards..., headless'] (odd "
        f"rounds reversed); A/A = headless'/headless of the same round. Main-thread CPU = the "
        f"app's UI thread, % of one core over the timed interval; tmux CPU = the tmux server. "
        f"{pairs.note()} Runs thrown away because other processes used "
        f"the CPU meanwhile: {'; '.join(rejected) or 'none'}. Wall time "
        f"{pairs.minutes:.1f} min.\n\n{table}\n\n"
        f"Target dashboard ≥ {TARGET} of headless: {'; '.join(verdicts)}."
    )
    publish(args, "Dashboard overhead: dashboard in a real terminal vs headless", body, figures)
