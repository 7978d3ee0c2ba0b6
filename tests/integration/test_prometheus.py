"""A real Prometheus (Debian's `prometheus` package) scraping memtop's endpoints on loopback:
two `memtop metrics` processes as two nodes (a live headless `memtop train` with the leak demo on
one, a finished run on the other), `memtop train --nproc 2 --metrics-port` (two rank series from
one endpoint) and the HF callback's in-process endpoint. What Prometheus returns is compared
with the run folders' rows at the step it scraped; memtop's alert rules are loaded and the leak
rule's expression turns true; every dashboard query runs. Waits poll Prometheus' HTTP API with a
deadline. Without the package these tests skip, naming the command that installs it (.ci/run
installs it, so CI runs them)."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from factories import ROOT, TINY_ARGS, start_cli, wait_until, write_run

from probes import records as R
from probes.records import record_from_json
from probes.runfolder import METRICS, find_runs, metrics_files, read_rows
from probes.runfolder.state import RunState

INSTALL = "apt-get install -y prometheus"
RULES = ROOT / "deploy" / "prometheus" / "memtop-rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "memtop.json"
DEADLINE_S = 90.0

# one worker, one cluster for the module; slow: a real training process and Prometheus (~10 s)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("prometheus")]


def prometheus_binary() -> str:
    path = shutil.which("prometheus") or ("/usr/bin/prometheus"
                                          if os.access("/usr/bin/prometheus", os.X_OK) else None)
    if path is None:
        pytest.skip(f"Prometheus is not installed here: {INSTALL} (Debian's package; "
                    ".ci/run installs it)")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Prometheus:
    """A prometheus process on a loopback port scraping ``targets`` every 2 s, with
    memtop's rules evaluated every second; queried through its HTTP API."""

    def __init__(self, tmp: Path, targets: list[str]) -> None:
        self.port = free_port()
        # 2 s: a scrape on a loaded 2-core machine (the suite's two workers) may take over 1 s
        config = {"global": {"scrape_interval": "2s", "scrape_timeout": "2s",
                             "evaluation_interval": "1s"},
                  "rule_files": [str(RULES)],
                  "scrape_configs": [{"job_name": "memtop",
                                      "static_configs": [{"targets": targets}]}]}
        path = tmp / "prometheus.yml"
        path.write_text(json.dumps(config))  # JSON is YAML
        self.log = open(tmp / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [prometheus_binary(), f"--config.file={path}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_until(self._ready, "prometheus to be ready", DEADLINE_S, poll_s=0.1)

    def _ready(self) -> bool:
        assert self.proc.poll() is None, f"prometheus exited: {self.log_text()[-2000:]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def log_text(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        url = f"http://127.0.0.1:{self.port}/api/v1/query?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def wait(self, expr: str, what: str, check=bool) -> list[dict]:
        """The query's result once ``check(result)`` holds (polled; fails after a deadline)."""
        def ready():
            result = self.query(expr)
            return result if result and check(result) else None
        return wait_until(ready, what, DEADLINE_S, poll_s=0.25)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


class Exporter:
    """A `memtop metrics FOLDER --port 0` process; its URL read from its first line."""

    def __init__(self, folder: Path, *args: str) -> None:
        self.proc = start_cli("metrics", str(folder), "--port", "0", *args,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in self.proc.stdout], daemon=True
                         ).start()
        try:
            line = lines.get(timeout=DEADLINE_S)
        except queue.Empty:
            self.proc.kill()
            raise AssertionError("memtop metrics did not start") from None
        self.url = line.split("serving ", 1)[1].split()[0]
        self.target = self.url.split("//", 1)[1].removesuffix("/metrics")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0, self.proc.stderr.read()


def value(result: list[dict], **labels: str) -> float:
    hits = [float(r["value"][1]) for r in result
            if all(r["metric"].get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (labels, result)
    return hits[0]


def folds_around(path: Path, step: int) -> set[bool]:
    """Whether a leak alert is open after step ``step``'s row, as the file tells it: before
    the events that follow the row and after them (a scrape may fall between the two)."""
    state, seen = RunState(), set()
    for row in read_rows(path).rows:
        if "event" not in row and row["step"] > step:
            break
        if "event" not in row and row["step"] == step:
            state.apply(record_from_json(row))
            seen.add(bool(state.alerts))
            continue
        state.apply(record_from_json(row))
    seen.add(bool(state.alerts))
    return seen


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """node-a: a live headless run with the leak demo from step 3; node-b: a finished run. Each
    folder has its own `memtop metrics`, and one Prometheus scrapes both."""
    prometheus_binary()
    tmp = tmp_path_factory.mktemp("prom")
    a, b = tmp / "a", tmp / "b"
    a.mkdir()
    finished = write_run(b / "20260101-000000-bbbbbb", steps=60)
    train = start_cli("train", "--headless", "--steps", "0", "--log-every", "1000",
                      "--leak-at", "3", "--run-dir", str(a), *TINY_ARGS,
                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    exporters: list[Exporter] = []
    prom = None
    try:
        exporters = [Exporter(a, "--host-label", "node-a"), Exporter(b, "--host-label", "node-b")]
        prom = Prometheus(tmp, [e.target for e in exporters])
        run = wait_until(lambda: (find_runs(a) or [None])[0], "the live run's folder",
                         DEADLINE_S, poll_s=0.1)
        yield prom, run, finished, train
    finally:
        if train.poll() is None:
            train.send_signal(signal.SIGINT)
        try:
            train.wait(60)
        except subprocess.TimeoutExpired:
            train.kill()
        if prom is not None:
            prom.stop()
        for exporter in exporters:
            exporter.stop()


def test_prometheus_returns_the_live_runs_rows_at_the_scraped_step(two_nodes):
    prom, run, _, _ = two_nodes
    prom.wait(f'memtop_steps_total{{host="node-a", run="{run.name}"}} >= 5',
              "Prometheus to scrape the live run's fifth step")
    at = time.time()  # one instant: every series from the same scrape
    result = prom.query('{__name__=~"memtop_steps_total|memtop_allocated_bytes|'
                        f'memtop_tokens_per_second|memtop_leak_alert", run="{run.name}"}}', at)
    got = {r["metric"]["__name__"]: float(r["value"][1]) for r in result}
    step = int(got["memtop_steps_total"])
    row = next(r for r in read_rows(run / METRICS).steps if r["step"] == step)
    assert got["memtop_allocated_bytes"] == row["allocated_bytes"]
    assert got["memtop_tokens_per_second"] == row["tokens_per_s"]
    assert bool(got["memtop_leak_alert"]) in folds_around(run / METRICS, step)
    labels = next(r["metric"] for r in result if r["metric"]["__name__"] == "memtop_steps_total")
    assert labels["rank"] == "0" and labels["device"] == "cpu" and labels["job"] == "memtop"


def test_sum_by_host_sees_both_nodes(two_nodes):
    prom, run, finished, _ = two_nodes
    result = prom.wait("sum by (host) (memtop_steps_total)", "both nodes' series",
                       lambda res: {r["metric"].get("host") for r in res} == {"node-a", "node-b"})
    assert value(result, host="node-b") == read_rows(finished / METRICS).steps[-1]["step"] == 60
    assert value(result, host="node-a") >= 1
    state = prom.query(f'memtop_run_state{{run="{finished.name}"}} == 1')
    assert [r["metric"]["state"] for r in state] == ["finished"]


def test_the_leak_demo_makes_the_leak_rule_true(two_nodes):
    """memtop's leak rule (deploy/prometheus/memtop-rules.yml), evaluated by Prometheus: its
    expression turns true (the alert is pending: it fires after its minute) on the node whose
    run leaks, once the run folder holds the leak watch's alert, and never on the other."""
    prom, run, _, _ = two_nodes
    alerts = prom.wait('ALERTS{alertname="MemtopLeakAlertOpen"}', "the leak rule to turn true")
    assert {a["metric"]["host"] for a in alerts} == {"node-a"}
    assert alerts[0]["metric"]["alertstate"] in ("pending", "firing")
    assert any(e["event"] == R.LEAK_SUSPECTED for e in read_rows(run / METRICS).events)
    rate = prom.query(f'memtop_leak_bytes_per_step{{run="{run.name}"}}')
    assert rate and float(rate[0]["value"][1]) > 0


def test_every_dashboard_query_runs_and_the_main_panels_have_data(two_nodes):
    prom, run, _, _ = two_nodes
    prom.wait(f'memtop_phase_seconds{{run="{run.name}"}}', "the step split's series")
    dash = json.loads(DASHBOARD.read_text())
    for panel in dash["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for var in ("host", "run", "rank"):
                expr = expr.replace(f"${var}", ".*")
            result = prom.query(expr)  # asserts Prometheus accepted it
            if panel["title"].startswith(("Memory per rank", "Tokens/s", "Step split",
                                          "Step time", "Leak alerts open")):
                assert result, (panel["title"], expr)


def test_a_killed_run_turns_interrupted(two_nodes):
    """kill -9: no run_finished, and its socket no longer answers: Prometheus sees the state
    turn from running to interrupted (the run-outcome rule of `memtop runs`)."""
    prom, run, _, train = two_nodes
    prom.wait(f'memtop_run_state{{run="{run.name}", state="running"}} == 1', "a running run")
    train.send_signal(signal.SIGKILL)
    train.wait(30)
    prom.wait(f'memtop_run_state{{run="{run.name}", state="interrupted"}} == 1',
              "the killed run to turn interrupted")
    assert not any(e["event"] == R.RUN_FINISHED for e in read_rows(run / METRICS).events)


def test_nproc_2_serves_both_ranks_from_one_endpoint(tmp_path):
    prometheus_binary()
    port = free_port()
    train = start_cli("train", "--headless", "--nproc", "2", "--steps", "0", "--log-every",
                      "1000", "--metrics-port", str(port), "--run-dir", str(tmp_path / "runs"),
                      *TINY_ARGS, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    prom = Prometheus(tmp_path, [f"127.0.0.1:{port}"])
    try:
        result = prom.wait("memtop_steps_total >= 3", "two ranks' series from one endpoint",
                           lambda res: {r["metric"]["rank"] for r in res} == {"0", "1"})
        (run,) = find_runs(tmp_path / "runs")
        assert {r["metric"]["run"] for r in result} == {run.name}
        assert {r["metric"]["instance"] for r in result} == {f"127.0.0.1:{port}"}
        at = time.time()
        got = prom.query(f'{{__name__=~"memtop_steps_total|memtop_allocated_bytes", '
                         f'run="{run.name}"}}', at)
        files = metrics_files(run)
        for rank in (0, 1):
            mine = {r["metric"]["__name__"]: float(r["value"][1]) for r in got
                    if r["metric"]["rank"] == str(rank)}
            row = next(r for r in read_rows(files[rank]).steps
                       if r["step"] == int(mine["memtop_steps_total"]))
            assert mine["memtop_allocated_bytes"] == row["allocated_bytes"], rank
    finally:
        prom.stop()
        train.send_signal(signal.SIGINT)
        out, err = train.communicate(timeout=120)
    assert train.returncode == 130, err[-2000:]
    assert "Prometheus metrics of every rank" in out


def test_the_hf_callback_serves_its_run_to_prometheus(tmp_path):
    """MemtopCallback(metrics_port=P) inside the real HF Trainer: at step 5 the training waits
    until Prometheus has scraped a step, and that scrape's values are the run folder's."""
    from factories import import_example, in_thread

    example = import_example("hf_trainer")
    from transformers import TrainerCallback

    from probes.integrations.transformers import MemtopCallback

    port = free_port()
    prom = Prometheus(tmp_path, [f"127.0.0.1:{port}"])
    seen: dict = {}

    from probes.runfolder.recorder import MAX_SOON_ROWS

    class WaitForScrape(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            # the recorder hands rows over in batches (at most MAX_SOON_ROWS or 50 ms): by
            # this step at least one batch is out, however fast the steps are
            if state.global_step == MAX_SOON_ROWS:
                prom.wait("memtop_steps_total >= 1", "a scrape of the HF run")
                at = time.time()
                seen["rows"] = prom.query('{__name__=~"memtop_steps_total|'
                                          'memtop_allocated_bytes"}', at)
                seen["state"] = prom.query("memtop_run_state == 1", at)

    memtop = MemtopCallback(listen=False, metrics_port=port, write_report=False)
    trainer = example.make_trainer(tmp_path / "hf", steps=MAX_SOON_ROWS + 2, grad_accum=1,
                                   batch_size=2,
                                   eval_steps=None, save_steps=None,
                                   callbacks=[memtop, WaitForScrape()])
    try:
        in_thread(trainer.train)
    finally:
        prom.stop()
    run = memtop.driver.last_run
    got = {r["metric"]["__name__"]: float(r["value"][1]) for r in seen["rows"]}
    step = int(got["memtop_steps_total"])
    row = next(r for r in read_rows(run / METRICS).steps if r["step"] == step)
    assert got["memtop_allocated_bytes"] == row["allocated_bytes"]
    assert [r["metric"]["state"] for r in seen["state"]] == ["running"]
    assert {r["metric"]["run"] for r in seen["rows"]} == {run.name}
