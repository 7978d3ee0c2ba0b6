"""Prometheus scraping a live run: training tokens/s with and without 100 scrapes a second.

    python -m benchmarks run metrics_scrape [--pairs 7] [--steps 150] [--rate 100]
        [--new-connection] [--no-append]

Three sides and a control, each its own headless `memtop train` process on the default config: plain
(A); `--metrics-port P` scraped at --rate per second by this script (the in-process endpoint: its
collector reads the recorder's state on the endpoint's thread, in the training process); and `memtop
metrics RUNS --port 0` as a separate process beside the run, scraped at the same rate (it follows
the run folder). Scraping starts when the run passes step --skip and goes on until it ends (choose
--steps so that is about 10 s). Rounds [plain, in-process, exporter, plain'] (odd rounds reversed)
give each side's tokens/s ratio to the round's plain run and the A/A noise plain'/plain. A fourth
side is the control: a plain run scraped the same way from a static endpoint (ten lines of
http.server in its own process, one fixed answer): in-process / static is memtop's own share of the
cost (benchmarks/harness/pairs.py). Every scrape must answer 200 with memtop's series: errors are
counted and reported. tokens/s = tokens of the steps after --skip over the wall time between those
step rows (benchmarks/harness/runs.py).
"""

from __future__ import annotations

import dataclasses
import http.client
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

from benchmarks.harness import RATIO_HEADER, ROOT, median, pct, publish, run_pairs, wait_quiet
from benchmarks.harness.runs import run_headless
from benchmarks.harness.terminal import SMOKE_ARGS, apply_run_options

TARGET = 0.99  # "costs nothing measurable": within 1%, judged against the A/A noise band


class Scraper:
    """GET ``url`` ``rate`` times a second on a thread, paced (a slow answer is not made up
    for), from start() until stop(); counts answers, errors and latencies. ``keep_alive``: one
    connection reused, as Prometheus reuses its own (http.client), else a new connection per
    scrape (urllib, what a script or curl does)."""

    def __init__(self, url: str, rate: float, keep_alive: bool = True) -> None:
        self.url, self.every, self.keep_alive = url, 1.0 / rate, keep_alive
        parts = urllib.parse.urlsplit(url)
        self._host, self._port, self._path = parts.hostname, parts.port, parts.path
        self._conn: http.client.HTTPConnection | None = None
        self.last_body: bytes | None = None  # the last good answer (the control serves it)
        self.latencies: list[float] = []
        self.errors: list[tuple[float, str]] = []  # (when, what)
        self.closed = False  # the endpoint went away (its run ended) before stop()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.seconds = 0.0

    def start(self, _pid: int | None = None) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = time.perf_counter()
        due = t0
        while not self._stop.is_set():
            start = time.perf_counter()
            try:
                status, body = self._get()
                if status != 200 or b"memtop_steps_total{" not in body:
                    self.errors.append((start, f"status {status}, {len(body)} bytes, "
                                               "no memtop_steps_total"))
            except OSError as exc:
                if self._stop.is_set():
                    break
                if isinstance(getattr(exc, "reason", exc), ConnectionRefusedError):
                    # the endpoint closed with its run (the in-process side's end): the
                    # connections reset while it shut down are not errors of a live run
                    self.closed = True
                    self.errors = [(t, e) for t, e in self.errors if t < start - 0.1
                                   or not e.startswith("ConnectionResetError")]
                    break
                self.errors.append((start, f"{type(exc).__name__}: {exc}"))
            else:
                self.latencies.append(time.perf_counter() - start)  # answered
                if status == 200:
                    self.last_body = body
            due += self.every
            self._stop.wait(max(0.0, due - time.perf_counter()))
        self.seconds = time.perf_counter() - t0

    def _get(self) -> tuple[int, bytes]:
        if not self.keep_alive:
            with urllib.request.urlopen(self.url, timeout=5) as resp:
                return resp.status, resp.read()
        for attempt in (1, 2):  # a kept connection the server closed: one new one
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=5)
            try:
                self._conn.request("GET", self._path)
                resp = self._conn.getresponse()
                return resp.status, resp.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self._conn.close()
                self._conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if self._conn is not None:
            self._conn.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def exporter(root: Path) -> tuple[subprocess.Popen, str]:
    """`memtop metrics ROOT --port 0`, and its URL (its first line)."""
    proc = subprocess.Popen([sys.executable, "-m", "tui.cli", "metrics", str(root), "--port",
                             "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL)
    line = proc.stdout.readline()
    if "serving " not in line:
        proc.kill()
        raise RuntimeError(f"memtop metrics did not start: {proc.stderr.read()[-300:]}")
    return proc, line.split("serving ", 1)[1].split()[0]


STATIC_SERVER = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
body = open(sys.argv[1], "rb").read()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def do_GET(self):
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
    def log_message(self, *a):
        pass
srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(f"serving http://127.0.0.1:{srv.server_address[1]}/metrics", flush=True)
srv.serve_forever()
"""


def static_endpoint(tmp: Path, answer: bytes) -> tuple[subprocess.Popen, str]:
    """The control: a server of ten lines in its own process answering every scrape with one
    fixed memtop answer (a real one, from an earlier round's scrape: the same bytes), with no
    collector, rendering or negotiation: what being scraped costs this machine whatever
    answers."""
    body = tmp / "answer.txt"
    body.write_bytes(answer)
    proc = subprocess.Popen([sys.executable, "-c", STATIC_SERVER, str(body)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    line = proc.stdout.readline()
    if "serving " not in line:
        proc.kill()
        raise RuntimeError(f"the static endpoint did not start: {proc.stderr.read()[-300:]}")
    return proc, line.split("serving ", 1)[1].split()[0]


def options(ap) -> None:
    ap.pairs(7, "plain, in-process, memtop metrics, static endpoint, plain'")
    ap.add_argument("--steps", type=int, default=150, help="steps per run: choose about "
                    "10 s of scraping after --skip (default config, fp32: ~150 here)")
    ap.add_argument("--skip", type=int, default=20, help="first steps left out")
    ap.add_argument("--rate", type=float, default=100.0, help="scrapes per second")
    ap.add_argument("--new-connection", action="store_true", help="a new connection per "
                    "scrape (urllib) instead of one kept alive, as Prometheus keeps it")
    ap.quiet(max_wait=900)
    ap.amp()
    ap.smoke()


def main(args) -> None:
    apply_run_options(args)
    timeout = max(600.0, args.steps * 4.0)
    scrapes: dict[str, list[Scraper]] = {}
    runs: dict[str, list[dict]] = {}

    def side_fn(side: str):
        def run_once() -> tuple[float, float]:
            wait_quiet(args.max_busy, args.max_wait, f"before {side}")
            extra: tuple[str, ...] = ()
            proc = None
            with tempfile.TemporaryDirectory(prefix="memtop-scrape-") as tmp:
                root = Path(tmp) / "runs"
                root.mkdir()
                scraper = None
                if side == "in-process":
                    port = free_port()
                    extra = ("--metrics-port", str(port))
                    scraper = Scraper(f"http://127.0.0.1:{port}/metrics", args.rate,
                                      not args.new_connection)
                elif side == "memtop metrics":
                    proc, url = exporter(root)
                    scraper = Scraper(url, args.rate, not args.new_connection)
                elif side == "static endpoint":
                    answer = next((sc.last_body for sc in reversed(scrapes.get("in-process", []))
                                   if sc.last_body), None)
                    if answer is None:
                        raise RuntimeError("the control needs an in-process scrape first")
                    proc, url = static_endpoint(Path(tmp), answer)
                    scraper = Scraper(url, args.rate, not args.new_connection)
                try:
                    res = run_headless(args.steps, args.skip, timeout, extra=extra, root=root,
                                       on_start=scraper.start if scraper else None)
                finally:
                    if scraper is not None:
                        scraper.stop()
                        scrapes.setdefault(side, []).append(scraper)
                    if proc is not None:
                        proc.terminate()
                        proc.wait(30)
            runs.setdefault(side, []).append(res)
            done = f", {len(scraper.latencies)} scrapes / {scraper.seconds:.1f} s, " \
                f"{len(scraper.errors)} errors" if scraper else ""
            print(f"  {side:>15}: {res['tokens_per_s']:8,.0f} tok/s over {res['steps']} steps / "
                  f"{res['wall_s']:.1f} s{done}; others {res.get('others_cores', 0):.2f} cores",
                  flush=True)
            return res["tokens_per_s"], res.get("others_cores", 0.0)
        return run_once

    sides = {s: side_fn(s) for s in ("plain", "in-process", "memtop metrics",
                                     "static endpoint")}
    pairs = run_pairs(args, "plain", sides, wait=False, show=False)
    rows, verdicts, figures = [], [], []
    for side in pairs.ratios:
        what = f"{side}, scraped {args.rate:g}/s / plain, tokens/s" + \
            (" (a new connection per scrape)" if args.new_connection else "")
        row, v = pairs.row(side, what, TARGET)
        rows.append(row)
        verdicts.append(f"{side}: {v}")
        fid = "metrics_scrape/" + {"in-process": "in_process", "memtop metrics": "exporter",
                                   "static endpoint": "static_endpoint"}[side] + \
            ("_new_connection" if args.new_connection else "")
        errors = sum(len(s.errors) for s in scrapes.get(side, []))
        fig = pairs.figure(fid, what, side, TARGET)
        if side == "static endpoint":  # the control: no target of its own
            fig = dataclasses.replace(fig, target="— (the control: any endpoint scraped so)",
                                      status="not judged")
        figures.append(fig if not errors else dataclasses.replace(
            fig, value=f"{fig.value}; {errors} scrape errors", status="missed"))
    lines = ["| side | tokens/s median | scrapes per run (median) | scrape latency p50 / p95 / "
             "max | errors |", "|---|---|---|---|---|"]
    for side, rs in runs.items():
        lat = [x for s in scrapes.get(side, []) for x in s.latencies]
        errors = [e for s in scrapes.get(side, []) for _, e in s.errors]
        count = median([len(s.latencies) for s in scrapes[side]]) if side in scrapes else 0
        lines.append(f"| {side} | {median([r['tokens_per_s'] for r in rs]):,.0f} | {count:.0f} | "
                     + (f"{pct(lat, 50) * 1e3:.1f} / {pct(lat, 95) * 1e3:.1f} / "
                        f"{max(lat) * 1e3:.1f} ms" if lat else "") + " | "
                     + (f"{len(errors)} ({errors[0]})" if errors else "0" if lat else "") + " |")
    static = pairs.ratios.get("static endpoint") or []
    versus = []
    for side in ("in-process", "memtop metrics"):
        per_round = [a / b for a, b in zip(pairs.ratios.get(side) or [], static, strict=False)
                     if b]
        if per_round:
            versus.append(f"{side} / static endpoint, per round: median "
                          f"{median(per_round):.3f} (min–max {min(per_round):.3f}–"
                          f"{max(per_round):.3f})")
    options = " " + " ".join(SMOKE_ARGS) if SMOKE_ARGS else ""
    body = (
        f"Config: `memtop train --headless` defaults{options}"
        f", {args.steps} steps per run, tokens/s over steps {args.skip}..{args.steps}. Scraped "
        f"{args.rate:g} times a second from step {args.skip} to the run's end by a thread of "
        f"the benchmark ("
        + ("urllib, one connection per scrape" if args.new_connection else
           "http.client, one connection kept alive, as Prometheus keeps it")
        + f"). {args.pairs} rounds of [plain, "
        f"in-process, memtop metrics, static endpoint, plain'] (odd rounds reversed). "
        f"{pairs.note()} Wall time {pairs.minutes:.1f} min.\n\n"
        f"{RATIO_HEADER}\n" + "\n".join(rows) + "\n\n" + "\n".join(lines) + "\n\n"
        "The control, `static endpoint`: a plain run scraped the same way from a ten-line server "
        "in its own process answering one fixed memtop answer (what being scraped costs this "
        "machine, whatever answers). memtop's own share: "
        + ("; ".join(versus) if versus else "n/a") + ".\n\n"
        f"Target ≥ {TARGET} of plain: {'; '.join(verdicts)}.")
    publish(args, "Prometheus scrapes against a live run: tokens/s with and without", body,
            figures)
