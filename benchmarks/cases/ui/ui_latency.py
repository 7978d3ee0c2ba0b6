"""UI responsiveness while training: key-to-redraw latency and the longest event-loop stall.

    python -m benchmarks run ui_latency [--seconds 150] [--profile-every 30] [--size 120x40]
                                        [--tmux-presses 30] [--no-append]

Part 1 (in process, Textual's headless driver): the real MemtopApp (MemtopApp.for_run, as
`memtop train` builds it: 2 Hz refresh, gc freeze, every instrument) over a real trainer thread on
the default config (B=16, T=128, 4 layers, dim 128, bf16, CPU). A thread standing in for Textual's
input thread (it calls driver.process_message(Key), the same path as the Linux driver) presses `?`
(help opens), `?` (help closes) and now and then `space` twice (pause, resume), waiting a random
0.2-0.6 s between presses, and every --profile-every seconds `p` (profiler window). Latency = key
injected -> the first frame the compositor produces that shows the change (App._display is
wrapped: help screen on top / header says PAUSING / status line says the profiler was requested).
The wrapper also turns each frame into terminal escape sequences (render_segments), so the
compositor and the encoding are counted; what the headless driver does not include is the write
to a real terminal and the terminal's own parsing (part 2 covers that end to end).
Meanwhile an asyncio task sleeps 10 ms over and over on the app's event loop and records how late
it wakes: the longest lateness is the longest stall of the UI event loop. Both are split by the
profiler's phase (no window / window steps incl. the profiler's stop and the trace export /
analysis of the table by the child process).

Part 2 (end to end, a real terminal): `memtop train` in a tmux pane; send `?` with tmux send-keys
and poll capture-pane every 20 ms until the help screen is visible (then `?` again until it is
gone). Includes the terminal write and tmux's parsing; resolution ~20 ms plus the ~5 ms a
capture-pane costs.

The runs are ui_latency_runs.py beside this file, what part 1 measures with
ui_latency_probes.py; this file is the case's options and its report.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
os.environ.setdefault("KINETO_LOG_LEVEL", "5")

from benchmarks.cases.ui.ui_latency_probes import GROUPS  # noqa: E402
from benchmarks.cases.ui.ui_latency_runs import (  # noqa: E402
    SMOKE_CONFIG,
    footer_watcher_fix,
    in_process,
    in_tmux,
)
from benchmarks.harness import Figure, load_avg, pct, publish, wait_quiet  # noqa: E402
from benchmarks.harness import met as met_target  # noqa: E402

TARGET_MS = 100.0


def fmt(v: float) -> str:
    return "n/a" if v != v else f"{v:.1f}"


def met(v: float) -> str:
    return met_target(v, TARGET_MS)


def key_table(presses: list[dict]) -> tuple[str, float, float]:
    """Key-to-redraw latency by key and phase, and p50, p95 of all presses while training."""
    rows = ["| key (what changes on screen) | phase | n | p50 ms | p95 ms | max ms | missed |",
            "|---|---|---|---|---|---|---|"]
    labels = sorted({p["key"] for p in presses})
    for label in labels:
        for group in GROUPS:
            sel = [p for p in presses if p["key"] == label and p["group"] == group]
            if not sel:
                continue
            ms = [p["ms"] for p in sel if p["ms"] is not None]
            rows.append(f"| {label} | {group} | {len(ms)} | {fmt(pct(ms, 50))} | "
                        f"{fmt(pct(ms, 95))} | {fmt(max(ms) if ms else float('nan'))} | "
                        f"{len(sel) - len(ms)} |")
    loaded = [p["ms"] for p in presses if p["ms"] is not None and "while paused" not in p["key"]]
    missed = sum(1 for p in presses if p["ms"] is None)
    p50, p95 = pct(loaded, 50), pct(loaded, 95)
    rows.append(f"| **all presses while training** | all | {len(loaded)} | **{fmt(p50)}** | "
                f"**{fmt(p95)}** | {fmt(max(loaded) if loaded else float('nan'))} | {missed} |")
    return "\n".join(rows), p50, p95


def segments_of(res: dict) -> tuple[tuple[str, list], tuple[str, list]]:
    """The lag ticks before the first key press and after it."""
    ticks, ks = res["ticks"], res["keys_start"]
    return (("no key presses (p twice)", [t for t in ticks if t[0] < ks]),
            ("keys pressed every 0.2-0.6 s", [t for t in ticks if t[0] >= ks]))


def stall_table(segments) -> str:
    """Event-loop lateness by part and phase."""
    srows = ["| part | phase | ticks | p50 late ms | p99 late ms | longest stall ms | "
             "ticks > 50 ms | ticks > 100 ms |", "|---|---|---|---|---|---|---|---|"]
    for seg, seg_ticks in segments:
        for group in (*GROUPS, "all"):
            late = [t[1] for t in seg_ticks if group == "all" or t[2] == group]
            if late:
                b = "**" if group == "all" else ""
                srows.append(f"| {seg} | {b}{group}{b} | {len(late)} | {fmt(pct(late, 50))} | "
                             f"{fmt(pct(late, 99))} | {b}{fmt(max(late))}{b} | "
                             f"{sum(v > 50 for v in late)} | {sum(v > 100 for v in late)} |")
    return "\n".join(srows)


def attribution_table(spans, segments, presses: list[dict]) -> str:
    """What each stall over 50 ms overlapped most, by part."""
    arows = ["| part | the stall overlapped most | stalls > 50 ms | > 100 ms | longest ms |",
             "|---|---|---|---|---|"]
    for seg, seg_ticks in segments:
        attributed = spans.attribute(seg_ticks, presses)
        for label, lates in sorted(attributed.items(), key=lambda kv: -max(kv[1])):
            arows.append(f"| {seg} | {label} | {len(lates)} | {sum(v > 100 for v in lates)} | "
                         f"{max(lates):.0f} |")
    return "\n".join(arows)


def work_table(spans, window: tuple[float, float]) -> str:
    """The recorded work itself: wall time vs the CPU time of its own thread."""
    wrows = ["| work | n | median wall ms | median CPU ms (that thread) | max wall ms |",
             "|---|---|---|---|---|"]
    for label, n, wmed, cmed, wmax in spans.table(*window)[:14]:
        wrows.append(f"| {label} | {n} | {wmed:.1f} | {fmt(cmed)} | {wmax:.1f} |")
    return "\n".join(wrows)


def ab_section(res: dict, fixed: dict, fl0: str, fl1: str) -> str:
    """Part 1 as shipped beside part 1 with the Footer watcher workaround (Textual #6666)."""
    def summary(r: dict) -> tuple:
        ms = [p["ms"] for p in r["presses"]
              if p["ms"] is not None and "while paused" not in p["key"]]
        opens = [p["ms"] for p in r["presses"] if p["ms"] is not None and "opens" in p["key"]]
        keyed = [t[1] for t in r["ticks"] if t[0] >= r["keys_start"]]
        gen2 = [(b - a) * 1000 for a, b, _c, lab in r["spans"].items
                if lab == "gc gen2 (MainThread)" and r["keys_start"] <= a <= r["window"][1]]
        return (pct(ms, 50), pct(ms, 95), pct(opens, 95), max(keyed) if keyed else
                float("nan"), len(gen2), statistics.median(gen2) if gen2 else float("nan"),
                r["others_cores"])

    rows_ab = ["| run | key p50 ms | key p95 ms | help-opens p95 ms | longest stall with keys "
               "ms | main-thread gen-2 gc passes | their median ms | others' CPU (cores) |",
               "|---|---|---|---|---|---|---|---|"]
    for name, r in (("as shipped", res), ("with the Footer watcher fix", fixed)):
        v = summary(r)
        rows_ab.append(f"| {name} | {fmt(v[0])} | {fmt(v[1])} | {fmt(v[2])} | {fmt(v[3])} "
                       f"| {v[4]} | {fmt(v[5])} | {v[6]:.2f} |")
    return (
        "A/B: the same part 1 again with the workaround for Textual issue #6666 installed in "
        "this process (before each Footer recompose, drop the `compact` watcher entries of "
        "detached FooterKeys; without it every screen change leaks 9 FooterKeys and their "
        "render caches, ~3k objects, which makes every later gen-2 gc pass on the UI thread "
        f"longer). Load {fl0} before, {fl1} after.\n\n" + "\n".join(rows_ab))


def tmux_section(tm: dict, size: tuple[int, int], load2: str) -> str:
    """Part 2's paragraph and table."""
    lat = tm["lat"]
    return (
        f"Part 2, end to end in tmux {size[0]}x{size[1]} (`memtop train`, default config, "
        f"training): `?` sent with send-keys, capture-pane polled every 20 ms until the help "
        f"screen shows / is gone; {len(lat)} presses (+{tm['misses']} not seen within 5 s); "
        f"load before {load2}.\n\n| n | p50 ms | p95 ms | max ms | target p95 ≤ 100 ms |\n"
        f"|---|---|---|---|---|\n| {len(lat)} | {fmt(pct(lat, 50))} | {fmt(pct(lat, 95))} | "
        f"{fmt(max(lat) if lat else float('nan'))} | "
        f"{met(pct(lat, 95))} |")


def part1(args, size: tuple[int, int], fix: bool) -> tuple[dict, str, str]:
    """Part 1, run again (3 tries at most) while other processes used over --max-busy cores;
    returns it with the load average before and after."""
    undo = footer_watcher_fix(fix)
    try:
        for attempt in range(3):
            wait_quiet(args.max_busy, args.max_wait, "before part 1")
            before = load_avg()
            res = asyncio.run(in_process(args.seconds, args.profile_every, size, args.seed,
                                         args.quiet_seconds))
            after = load_avg()
            if res["others_cores"] <= args.max_busy:
                break
            print(f"part 1: other processes used {res['others_cores']:.2f} cores meanwhile; "
                  f"run again ({attempt + 1}/3)", flush=True)
    finally:
        undo()
    return res, before, after


def options(ap) -> None:
    ap.add_argument("--seconds", type=float, default=150.0,
                    help="in-process measurement with key presses")
    ap.add_argument("--quiet-seconds", type=float, default=60.0,
                    help="before that: training with no key presses but p twice")
    ap.add_argument("--profile-every", type=float, default=30.0, help="press p this often (s)")
    ap.add_argument("--size", default="120x40")
    ap.add_argument("--tmux-presses", type=int, default=30, help="0 skips part 2")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ab-footer-fix", action="store_true",
                    help="also run part 1 with the Footer watcher workaround (Textual #6666)")
    ap.quiet(max_wait=900)
    ap.smoke("tiny model, no waiting")


def main(args) -> None:
    if args.smoke:
        SMOKE_CONFIG.update(layers=1, heads=2, dim=32, seq_len=16, block_size=32, batch_size=4)
        args.no_append, args.max_busy, args.max_wait = True, 99.0, 0.0
    size = tuple(int(v) for v in args.size.split("x"))
    t_all = time.monotonic()
    res, load1, load1_end = part1(args, size, False)
    print(f"part 1: others used {res['others_cores']:.2f} cores, this process "
          f"{res['own_cores']:.2f}", flush=True)
    print(f"part 1: {res['steps']} steps in {res['wall_s']:.0f} s, {res['windows']} profiler "
          f"windows, {res['frames']} frames, {len(res['presses'])} presses", flush=True)

    presses = res["presses"]
    key_text, p50, p95 = key_table(presses)
    ticks = res["ticks"]
    segments = segments_of(res)
    all_late = [t[1] for t in ticks]
    worst = max(all_late) if all_late else float("nan")
    quiet_late = [t[1] for t in segments[0][1]]
    worst_quiet = max(quiet_late) if quiet_late else float("nan")
    stall_text = stall_table(segments)
    worst_ticks = sorted(ticks, key=lambda t: -t[1])[:5]
    attribution = attribution_table(res["spans"], segments, presses)
    work_text = work_table(res["spans"], res["window"])
    enc = res["encode_ms"]

    ab_text = ""
    if args.ab_footer_fix:
        fixed, fl0, fl1 = part1(args, size, True)
        ab_text = ab_section(res, fixed, fl0, fl1)
        print(ab_text, flush=True)
    keyed_late = [t[1] for t in segments[1][1]]
    worst_keyed = max(keyed_late) if keyed_late else float("nan")
    figures = [
        Figure("ui_latency/key_p95", "key-to-redraw p95 while training, all keys incl. help "
               "(in process)", f"≤ {TARGET_MS:g} ms", f"{fmt(p95)} ms (p50 {fmt(p50)} ms, "
               f"{len(presses)} presses)", met(p95)),
        Figure("ui_latency/stall_no_keys", "longest UI stall, no key presses (profiler "
               "windows and their analysis included)", f"≤ {TARGET_MS:g} ms",
               f"{fmt(worst_quiet)} ms", met(worst_quiet)),
        Figure("ui_latency/stall_keys", "longest UI stall with a key every 0.2–0.6 s",
               f"≤ {TARGET_MS:g} ms", f"{fmt(worst_keyed)} ms", met(worst_keyed))]
    tmux_text = "Part 2 not run (--tmux-presses 0)."
    tmux_verdict = ""
    if args.tmux_presses > 0:
        wait_quiet(args.max_busy, args.max_wait, "before part 2")
        load2 = load_avg()
        tm = in_tmux(args.tmux_presses, size, args.seed)
        tmux_text = tmux_section(tm, size, load2)
        tmux_p95 = pct(tm["lat"], 95)
        tmux_verdict = f"; end to end in tmux p95 {fmt(tmux_p95)} ms"
        figures.append(Figure("ui_latency/tmux_p95", "key-to-redraw p95 end to end in tmux "
                              "(`?` shown / gone, capture-pane every 20 ms)",
                              f"≤ {TARGET_MS:g} ms", f"{fmt(tmux_p95)} ms ({len(tm['lat'])} "
                              f"presses)", met(tmux_p95)))
        print(tmux_text, flush=True)

    verdict = (f"key-to-redraw p95 {fmt(p95)} ms (target ≤ 100: {met(p95)}); longest event-loop "
               f"stall {fmt(worst)} ms over the whole run (target ≤ 100: {met(worst)}), "
               f"{fmt(worst_quiet)} ms without key presses incl. the profiler windows and their "
               f"analysis (target ≤ 100: {met(worst_quiet)}){tmux_verdict}")
    body = (
        f"Part 1, in process: MemtopApp.for_run on the default config (B=16, T=128, 4 layers, "
        f"dim 128, explicit attention, bf16, CPU; refresh 2 Hz, gc frozen after start-up, all "
        f"instruments), App.run_test(size={size}), measured after step 20: first "
        f"{args.quiet_seconds:.0f} s with no key presses but p twice, then {args.seconds:.0f} s "
        f"of key presses; {res['steps']} training steps, {res['windows']} profiler windows (p "
        f"every {args.profile_every:.0f} s in the second part; wait 1 / warmup 1 / active 3, "
        f"table computed by the child process), {res['frames']} frames. Keys go through "
        f"driver.process_message from a thread "
        f"(Textual's input-thread path); latency = injection to the first compositor frame "
        f"showing the change, frames encoded to escape sequences (median "
        f"{fmt(statistics.median(enc) if enc else float('nan'))} ms, max "
        f"{fmt(max(enc) if enc else float('nan'))} ms per frame) but not written to a "
        f"terminal. Event-loop stall = lateness of a 10 ms asyncio sleep on the app's loop. "
        f"Phase: window = profiler wait/warmup/active steps incl. the profiler's stop and the "
        f"trace export; analysis = until the table arrives. Load average {load1} before, "
        f"{load1_end} after; this process used {res['own_cores']:.2f} cores, other processes "
        f"{res['others_cores']:.2f} cores meanwhile; "
        f"{(time.monotonic() - t_all) / 60:.1f} min in all.\n\n"
        f"Key-to-redraw latency:\n\n{key_text}\n\nEvent-loop stalls:\n\n{stall_text}\n\n"
        f"Five longest stalls (ms, phase): "
        f"{', '.join(f'{t[1]:.0f} ({t[2]})' for t in worst_ticks)}.\n\n"
        f"What each stall over 50 ms overlapped (timed wrappers around the app's refresh tick, "
        f"Textual's layout and compositor passes, the profiler's stop + export on the training "
        f"thread, and gc callbacks on every thread):\n\n{attribution}\n\n"
        f"The recorded work itself (wall time vs the CPU time of its own thread: wall ≫ CPU "
        f"means it waited for the GIL or a core):\n\n{work_text}\n\n{tmux_text}\n\n"
        f"{ab_text + chr(10) * 2 if ab_text else ''}Result: {verdict}."
    )
    publish(args, "UI responsiveness: key-to-redraw latency and event-loop stalls", body,
            figures, "\n".join((key_text, stall_text, attribution, work_text, verdict)))
