"""Memory over time: memtop's own RSS over a long headless run and a long dashboard run.

    python -m benchmarks run memory_soak [--steps 100000] [--warm-step 2000] [--dash-minutes 10]
                                         [--warm-seconds 60] [--skip-headless] [--skip-dashboard]
                                         [--no-append]

Both runs train a tiny config (--layers 1 --dim 32 --heads 2 --seq-len 16 --batch-size 4), so
steps are quick and whatever memtop itself keeps per step (rings, sinks, detector and UI
histories, the metrics writer) would dominate any growth. Target (issue 7): < 5 MiB of growth
after warm-up.
- headless: `python -m tui.cli train --headless --steps N`; RSS from the step rows'
  host_rss_bytes (/proc/self/statm read by the trainer each step), at --warm-step vs the last
  step, plus the max after warm-up and a least-squares slope; /proc/PID/status VmRSS is sampled
  every 5 s from outside as a cross-check.
- dashboard: `python -m tui.cli train --steps 0` in a tmux pane (120x40) for --dash-minutes;
  VmRSS of the app process sampled every 5 s (warm = --warm-seconds after the start), and the
  step rows' host_rss_bytes likewise; then q.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.harness import ROOT, Figure, load_avg, met, proc_rss_bytes, publish
from benchmarks.harness.terminal import TINY, TmuxPane, memtop_argv, run_folder

TARGET_MIB = 5.0  # headless, after its warm-up steps
DASH_TARGET_MIB = 2.0  # dashboard, after its first --warm-seconds (its first 2 minutes)
MIB = 1024 * 1024


def rss_rows(metrics: Path) -> list[tuple[int, float, int, int | None]]:
    """(step, time_s, host_rss_bytes, allocated_bytes) of every step row."""
    out = []
    with open(metrics, encoding="utf-8") as fh:
        for line in fh:
            if line.startswith('{"step"'):
                r = json.loads(line)
                if r.get("host_rss_bytes") is not None:
                    out.append((r["step"], r["time_s"], r["host_rss_bytes"],
                                r.get("allocated_bytes")))
    return out


def slope_per_1k(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs, per 1000 x (bytes per 1000 steps / seconds)."""
    n = len(xs)
    if n < 2:
        return float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    return 1000 * sxy / sxx if sxx else float("nan")


def at_or_after(rows: list, step: int):
    for r in rows:
        if r[0] >= step:
            return r
    return rows[-1]


def summarise_steps(rows: list, warm_step: int) -> dict:
    warm = at_or_after(rows, warm_step)
    last = rows[-1]
    after = [r for r in rows if r[0] >= warm[0]]
    heap = [r for r in after if r[3] is not None]
    return {
        "warm_step": warm[0], "last_step": last[0], "rss_warm": warm[2], "rss_end": last[2],
        "rss_max_after": max(r[2] for r in after), "rss_min_after": min(r[2] for r in after),
        "growth": last[2] - warm[2],
        "slope_per_1k_steps": slope_per_1k([r[0] for r in after], [r[2] for r in after]),
        "heap_warm": heap[0][3] if heap else None, "heap_end": heap[-1][3] if heap else None,
    }


def headless(steps: int, warm_step: int, sample_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="memtop-soak-") as tmp:
        t0 = time.monotonic()
        proc = subprocess.Popen(memtop_argv("--headless", "--steps", str(steps), *TINY,
                                            "--log-every", "10000", "--run-dir", tmp),
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        outside: list[tuple[float, int]] = []
        while proc.poll() is None:
            rss = proc_rss_bytes(proc.pid)
            if rss is not None:
                outside.append((time.monotonic() - t0, rss))
            try:
                proc.wait(sample_s)
            except subprocess.TimeoutExpired:
                pass
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"headless soak exited {proc.returncode}: {err[-800:]}")
        run = run_folder(Path(tmp))
        rows = rss_rows(run / "metrics.jsonl")
        res = summarise_steps(rows, warm_step)
        res["wall_s"] = time.monotonic() - t0
        res["step_ms"] = 1000 * (rows[-1][1] - rows[0][1]) / max(1, rows[-1][0] - rows[0][0])
        res["metrics_mib"] = (run / "metrics.jsonl").stat().st_size / MIB
        res["outside"] = outside
        warm_t = next((r[1] for r in rows if r[0] >= res["warm_step"]), 0.0)
        after = [v for t, v in outside if t >= warm_t + 2]
        res["outside_max_after"] = max(after) if after else None
        res["outside_last"] = outside[-1][1] if outside else None
        return res


def dashboard(minutes: float, warm_s: float, sample_s: float, help_every_s: float,
              profile_every_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="memtop-soak-dash-") as tmp:
        pane = TmuxPane(f"soak-{int(time.time())}", 120, 40,
                        memtop_argv("--steps", "0", *TINY, "--run-dir", tmp))
        t0 = time.monotonic()
        samples: list[tuple[float, int]] = []
        kinds: list[tuple[int | None, int | None]] = []  # (RssAnon, RssFile) of each sample
        presses = {"help": 0, "p": 0}
        next_help = help_every_s if help_every_s > 0 else float("inf")
        next_prof = profile_every_s if profile_every_s > 0 else float("inf")
        try:
            while time.monotonic() - t0 < minutes * 60:
                rss = proc_rss_bytes(pane.pid)
                if rss is None or pane.dead:
                    raise RuntimeError(f"the dashboard exited early:\n{pane.capture()}")
                now = time.monotonic() - t0
                samples.append((now, rss))
                kinds.append((proc_rss_bytes(pane.pid, "RssAnon"),
                              proc_rss_bytes(pane.pid, "RssFile")))
                if now >= next_help:  # a user opening and closing the help screen
                    pane.send("?")
                    time.sleep(1.0)
                    pane.send("?")
                    presses["help"] += 1
                    next_help += help_every_s
                if now >= next_prof:  # and asking for a profiler window
                    pane.send("p")
                    presses["p"] += 1
                    next_prof += profile_every_s
                time.sleep(sample_s)
            screen = pane.capture()
            pane.send("q")
            if not pane.wait_dead(120):
                raise RuntimeError("the dashboard did not exit after q")
            code = pane.exit_status()
            run = run_folder(Path(tmp))
            rows = rss_rows(run / "metrics.jsonl")
        finally:
            pane.kill()
            TmuxPane.kill_server()
    warm_at = next(i for i, s in enumerate(samples) if s[0] >= warm_s)
    warm = samples[warm_at]
    after = [s for s in samples if s[0] >= warm[0]]
    # the step at the warm time: time_s in rows counts from the trainer's start, ~1-2 s after
    # ours; close enough to pick the row-based warm point
    warm_row = next((r for r in rows if r[1] >= warm_s), rows[0])
    steps = summarise_steps(rows, warm_row[0])
    return {
        "exit": code, "samples": len(samples), "rss_warm": warm[1], "rss_end": samples[-1][1],
        "rss_max_after": max(v for _, v in after), "rss_min_after": min(v for _, v in after),
        "growth": samples[-1][1] - warm[1],
        "anon_growth": _growth(kinds[warm_at][0], kinds[-1][0]),
        "file_growth": _growth(kinds[warm_at][1], kinds[-1][1]),
        "slope_per_1k_s": slope_per_1k([t for t, _ in after], [v for _, v in after]),
        "steps": rows[-1][0], "rows": steps, "screen_ok": "STEP" in screen.upper(),
        "presses": presses,
        "per_minute": [(t, v) for t, v in samples if int(t) % 60 < sample_s] ,
    }


def _growth(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else after - before


def signed_mib(v: float | None) -> str:
    return "n/a" if v is None else f"{v / MIB:+.2f}"


def mib(v: float | None) -> str:
    return "n/a" if v is None else f"{v / MIB:.2f}"


def options(ap) -> None:
    ap.add_argument("--steps", type=int, default=100_000, help="headless steps")
    ap.add_argument("--warm-step", type=int, default=2000)
    ap.add_argument("--dash-minutes", type=float, default=10.0)
    ap.add_argument("--warm-seconds", type=float, default=120.0)
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--help-every", type=float, default=30.0,
                    help="dashboard: open and close the help screen every S s (0: never)")
    ap.add_argument("--profile-every", type=float, default=120.0,
                    help="dashboard: press p every S s (0: never)")
    ap.add_argument("--skip-headless", action="store_true")
    ap.add_argument("--skip-dashboard", action="store_true")


def main(args) -> None:
    parts: list[str] = []
    verdicts: list[str] = []
    figures: list[Figure] = []
    cfg = " ".join(TINY)
    if not args.skip_headless:
        load0 = load_avg()
        h = headless(args.steps, args.warm_step, args.sample_s)
        load1 = load_avg()
        ok = met(h["growth"] / MIB, TARGET_MIB)
        verdicts.append(f"headless {h['last_step']:,} steps: {h['growth'] / MIB:+.2f} MiB "
                        f"({ok})")
        figures.append(Figure("memory_soak/headless", f"memtop's own RSS, headless "
                              f"{h['last_step']:,} tiny steps (from step {h['warm_step']:,})",
                              f"< {TARGET_MIB:g} MiB", f"{h['growth'] / MIB:+.2f} MiB (slope "
                              f"{h['slope_per_1k_steps'] / MIB:+.4f} MiB per 1000 steps)", ok))
        parts.append(
            f"Headless: `python -m tui.cli train --headless --steps {args.steps} {cfg}`, "
            f"{h['last_step']:,} steps in {h['wall_s'] / 60:.1f} min ({h['step_ms']:.2f} ms/step;"
            f" metrics.jsonl {h['metrics_mib']:.0f} MiB on disk). Load average {load0} before, "
            f"{load1} after.\n\n"
            "| figure | MiB |\n|---|---|\n"
            f"| RSS at step {h['warm_step']:,} (warm) | {mib(h['rss_warm'])} |\n"
            f"| RSS at step {h['last_step']:,} (end) | {mib(h['rss_end'])} |\n"
            f"| **growth after warm-up** (target < {TARGET_MIB:g} MiB: {ok}) | "
            f"**{h['growth'] / MIB:+.2f}** |\n"
            f"| min / max RSS after warm-up | {mib(h['rss_min_after'])} / "
            f"{mib(h['rss_max_after'])} |\n"
            f"| least-squares slope after warm-up, per 1000 steps | "
            f"{h['slope_per_1k_steps'] / MIB:+.4f} |\n"
            f"| glibc heap in use at warm / end | {mib(h['heap_warm'])} / {mib(h['heap_end'])} |\n"
            f"| VmRSS sampled from outside every {args.sample_s:g} s: max after warm-up / last | "
            f"{mib(h['outside_max_after'])} / {mib(h['outside_last'])} |")
        print(parts[-1], flush=True)
    if not args.skip_dashboard:
        load0 = load_avg()
        d = dashboard(args.dash_minutes, args.warm_seconds, args.sample_s, args.help_every,
                      args.profile_every)
        load1 = load_avg()
        ok = met(d["growth"] / MIB, DASH_TARGET_MIB)
        r = d["rows"]
        verdicts.append(f"dashboard {args.dash_minutes:g} min ({d['steps']:,} steps): "
                        f"{d['growth'] / MIB:+.2f} MiB ({ok})")
        figures.append(Figure("memory_soak/dashboard", f"memtop's own RSS, dashboard "
                              f"{args.dash_minutes:g} min (from {args.warm_seconds:g} s; `?` "
                              f"every {args.help_every:g} s, `p` every {args.profile_every:g} s)",
                              f"< {DASH_TARGET_MIB:g} MiB", f"{d['growth'] / MIB:+.2f} MiB "
                              f"(RssAnon {signed_mib(d['anon_growth'])}, RssFile "
                              f"{signed_mib(d['file_growth'])})", ok))
        parts.append(
            f"Dashboard: `python -m tui.cli train --steps 0 {cfg}` in tmux 120x40 for "
            f"{args.dash_minutes:g} min ({d['steps']:,} steps), VmRSS of the app process every "
            f"{args.sample_s:g} s ({d['samples']} samples), warm = {args.warm_seconds:g} s; keys "
            f"sent meanwhile: ? open + close {d['presses']['help']} times (every "
            f"{args.help_every:g} s), p {d['presses']['p']} times (every "
            f"{args.profile_every:g} s); exit "
            f"status after q: {d['exit']}. Load average {load0} before, {load1} after.\n\n"
            "| figure | MiB |\n|---|---|\n"
            f"| VmRSS at {args.warm_seconds:g} s (warm) | {mib(d['rss_warm'])} |\n"
            f"| VmRSS at the end | {mib(d['rss_end'])} |\n"
            f"| **growth after warm-up** (target < {DASH_TARGET_MIB:g} MiB: {ok}) | "
            f"**{d['growth'] / MIB:+.2f}** |\n"
            f"| of it private (RssAnon) / file pages mapped in (RssFile: code read on first "
            f"use) | {signed_mib(d['anon_growth'])} / {signed_mib(d['file_growth'])} |\n"
            f"| min / max after warm-up | {mib(d['rss_min_after'])} / "
            f"{mib(d['rss_max_after'])} |\n"
            f"| least-squares slope after warm-up, per 1000 s | "
            f"{d['slope_per_1k_s'] / MIB:+.3f} |\n"
            f"| step rows' host_rss_bytes: step {r['warm_step']:,} -> {r['last_step']:,} | "
            f"{mib(r['rss_warm'])} -> {mib(r['rss_end'])} ({r['growth'] / MIB:+.2f}) |\n"
            f"| glibc heap in use at warm / end | {mib(r['heap_warm'])} / "
            f"{mib(r['heap_end'])} |\n\nVmRSS about every minute (s: MiB): "
            + ", ".join(f"{t:.0f}: {v / MIB:.1f}" for t, v in d["per_minute"]))
        print(parts[-1], flush=True)
    if not parts:
        return
    body = (f"Tiny config `{cfg}` (bf16, CPU), memtop's every instrument on.\n\n"
            + "\n\n".join(parts) + f"\n\nResult: {'; '.join(verdicts)}.")
    publish(args, "Memory over time: memtop's own RSS in long runs", body, figures,
            shown=f"Result: {'; '.join(verdicts)}.")
