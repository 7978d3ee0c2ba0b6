"""`memtop train` as a measured process: headless (a plain subprocess) or drawing in a tmux
pane, its metrics.jsonl read while it writes, and the CPU the app, its UI thread, the tmux server
and everything else used between step --skip and the run's end. Shared by the cases
dashboard_overhead (tokens/s, dashboard vs headless, and its --diagnose), metrics_scrape and
ui_latency (part 2 waits for the pane's first steps).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.harness.paths import ROOT
from benchmarks.harness.procfs import cpu_busy_s, proc_cpu_s
from benchmarks.harness.terminal import TmuxPane, memtop_argv, run_folder

# ---- the run folder, read while memtop writes it -----------------------------------------------

def tail_has(path: Path, needle: str, tail: int = 8192) -> bool:
    """Whether the file's last ``tail`` bytes hold ``needle`` (run_finished, without reading a
    long metrics.jsonl from the start every poll)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - tail))
            return needle.encode() in fh.read()
    except OSError:
        return False


def last_step(path: Path) -> int:
    """The step of the last step row in metrics.jsonl (0 when none yet)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 8192))
            lines = fh.read().splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        if line.startswith(b'{"step"'):
            try:
                return int(json.loads(line)["step"])
            except (ValueError, KeyError):
                continue
    return 0


def step_rows(path: Path) -> list[dict]:
    """Every step row of metrics.jsonl (events left out)."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.startswith('{"step"'):
                rows.append(json.loads(line))
    return rows


def throughput(path: Path, skip: int) -> tuple[float, int, float]:
    """(tokens/s, steps counted, seconds) between step `skip` and the last step row."""
    rows = step_rows(path)
    by_step = {r["step"]: r for r in rows}
    first, last = by_step[skip], rows[-1]
    cfg = json.loads((path.parent / "config.json").read_text(encoding="utf-8"))
    tokens_per_step = cfg["batch_size"] * cfg["seq_len"]
    steps = last["step"] - first["step"]
    wall = last["time_s"] - first["time_s"]
    return steps * tokens_per_step / wall, steps, wall


def screen_step(screen: str) -> int:
    """The step the dashboard's screen shows (0 before the first)."""
    m = re.search(r"step (\d+)", screen)
    return int(m.group(1)) if m else 0


# ---- one run of each side ---------------------------------------------------------------------

def watch_interval(pid: int, metrics: Path, skip: int, steps: int, done,
                   timeout_s: float, on_start=None) -> dict:
    """Poll until the run passes step `skip` (note CPU times), then until `done()` (again).
    others_cores: CPU the rest of the machine used meanwhile (busy minus the app, tmux and
    this script), in cores; a run where others used the CPU is not comparable."""
    t0 = time.monotonic()
    start = None
    server = TmuxPane.server_pid() if TmuxPane._server_started else None
    me = os.getpid()

    def snap() -> tuple:
        return (time.perf_counter(), proc_cpu_s(pid), proc_cpu_s(pid, pid),
                proc_cpu_s(server) if server else 0.0, cpu_busy_s(), proc_cpu_s(me))

    while time.monotonic() - t0 < timeout_s:
        if start is None and last_step(metrics) >= skip:
            start = snap()
            start_wall = time.time()
            if on_start is not None:
                on_start(pid)
        if done():
            break
        time.sleep(0.25)
    else:
        raise RuntimeError(f"run did not finish in {timeout_s:.0f} s ({metrics})")
    end = snap()
    out: dict = {"end_wall": time.time()}
    if start is not None:
        out["start_wall"] = start_wall
    if start is not None and None not in start and None not in end:
        wall = end[0] - start[0]
        d = [e - s for s, e in zip(start, end, strict=True)]
        out["process_cpu_pct"] = 100 * d[1] / wall
        out["main_thread_cpu_pct"] = 100 * d[2] / wall
        if server:
            out["tmux_cpu_pct"] = 100 * d[3] / wall
        out["others_cores"] = max(0.0, (d[4] - d[1] - d[3] - d[5]) / wall)
    return out


def run_headless(steps: int, skip: int, timeout_s: float, gc_log: str | None = None,
                 on_start=None, extra: tuple[str, ...] = (), root: Path | None = None) -> dict:
    """One headless run: ``extra`` options for `memtop train`, ``root`` its --run-dir (a
    fresh temporary folder by default)."""
    with tempfile.TemporaryDirectory(prefix="memtop-ovh-") as tmp:
        root = Path(tmp) if root is None else root
        proc = subprocess.Popen(memtop_argv("--headless", "--steps", str(steps), "--run-dir",
                                            str(root), "--log-every", "1000000", *extra,
                                            gc_log=gc_log),
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        metrics = run_folder(root) / "metrics.jsonl"
        cpu = watch_interval(proc.pid, metrics, skip, steps, lambda: proc.poll() is not None or
                             tail_has(metrics, '"event":"run_finished"'), timeout_s, on_start)
        code = proc.wait(timeout=120)
        if code != 0:
            raise RuntimeError(f"headless run exited {code}: {proc.stderr.read().decode()[-500:]}")
        tps, n, wall = throughput(metrics, skip)
        return {"tokens_per_s": tps, "steps": n, "wall_s": wall, "exit": code, **cpu}


def run_dashboard(width: int, height: int, steps: int, skip: int, timeout_s: float,
                  gc_log: str | None = None, on_start=None) -> dict:
    with tempfile.TemporaryDirectory(prefix="memtop-ovh-") as tmp:
        root = Path(tmp)
        pane = TmuxPane(f"ovh{width}x{height}-{int(time.time() * 1000) % 10**8}", width, height,
                        memtop_argv("--steps", str(steps), "--run-dir", str(root), gc_log=gc_log))
        try:
            metrics = run_folder(root) / "metrics.jsonl"
            cpu = watch_interval(pane.pid, metrics, skip, steps,
                                 lambda: pane.dead or tail_has(metrics, '"event":"run_finished"'),
                                 timeout_s, on_start)
            screen = pane.capture()
            pane.send("q")  # the app stays up after the last step: q quits (report, exit 0)
            if not pane.wait_dead(120):
                raise RuntimeError("the dashboard did not exit after q")
            code = pane.exit_status()
            if code != 0:
                raise RuntimeError(f"dashboard exited {code}; screen:\n{pane.capture()}")
            tps, n, wall = throughput(metrics, skip)
            stderr_log = metrics.parent / "stderr.log"
            return {"tokens_per_s": tps, "steps": n, "wall_s": wall, "exit": code,
                    "screen_ok": "step" in screen and "STOPPED" in screen.upper(),
                    "stderr_log_bytes": stderr_log.stat().st_size if stderr_log.exists() else 0,
                    **cpu}
        finally:
            pane.kill()


def tmux_version() -> str:
    """tmux's version, as the results name the terminal the dashboard drew in."""
    try:
        return subprocess.run(["tmux", "-V"], capture_output=True, text=True).stdout.split()[-1]
    except (OSError, IndexError):
        return "?"

