"""The Prometheus exporter over run folders (probes/export/): every name with its labels, the
run folder's values, what is never exported (junk lines, NaN), the run's state word (a killed
run turns interrupted), new, ended and deleted runs, the HTTP endpoint (only /metrics, TLS, bad
input) and the in-process endpoint of a Monitor. Real files, sockets and HTTP; the real
Prometheus scraping these is tests/integration/test_prometheus.py."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from factories import make_sample, record_line, run_cli, wait_until, write_run
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from probes import records as R
from probes.control.requests import RunControl
from probes.control.unix_socket import ControlServer
from probes.export import FolderCollector, MetricsEndpoint, families
from probes.export.collector import RecorderCollector
from probes.export.names import EXPORTED, STATES
from probes.records import Event
from probes.runfolder import METRICS, RunRecorder, json_line, read_rows

# the issue's list of names, written out: names.py must export exactly these
NAMES = ["memtop_allocated_bytes", "memtop_reserved_bytes", "memtop_peak_allocated_bytes",
         "memtop_driver_used_bytes", "memtop_steps_total", "memtop_step_seconds",
         "memtop_tokens_per_second", "memtop_loss", "memtop_grad_scale",
         "memtop_skipped_steps_total", "memtop_phase_seconds", "memtop_leak_alert",
         "memtop_leak_bytes_per_step", "memtop_seconds_to_full", "memtop_run_info",
         "memtop_run_state", "memtop_unreadable_rows_total"]


def test_the_exported_names_are_the_issues():
    assert sorted(EXPORTED) == sorted(NAMES)


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Exposition text -> {(sample name, labels): value}, read by prometheus_client's parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def scrape(collector) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry).decode()


def value(found: dict, name: str, **labels: str) -> float | None:
    hits = [v for (n, ls), v in found.items()
            if n == name and all((k, want) in ls for k, want in labels.items())]
    assert len(hits) <= 1, f"{name} {labels}: {len(hits)} series"
    return hits[0] if hits else None


def append(run_dir, *records) -> None:
    with open(run_dir / METRICS, "ab") as fh:
        for record in records:
            fh.write(record_line(record))


def open_run(path, **started):
    """A run folder with run_started and no end yet (a run in progress, or a killed one)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"layers": 1, "dim": 32}))
    append(path, Event(R.RUN_STARTED, 0, 0.0, {"device": "cpu", "amp": "bf16", "params": 10,
                                               "host": "trainhost", **started}))
    return path


def test_every_name_with_its_labels_and_the_rows_values(tmp_path):
    run = write_run(tmp_path / "runs" / "20260101-000000-aaaaaa", steps=12)
    last = read_rows(run / METRICS).steps[-1]
    found = samples(scrape(FolderCollector([tmp_path / "runs"])))
    names = {n for n, _ in found}
    assert set(NAMES) - {"memtop_grad_scale", "memtop_phase_seconds",
                         "memtop_leak_bytes_per_step", "memtop_seconds_to_full"} <= names
    labels = {"run": run.name, "rank": "0", "device": "cpu", "host": socket.gethostname()}
    assert value(found, "memtop_allocated_bytes", **labels) == last["allocated_bytes"]
    assert value(found, "memtop_reserved_bytes", **labels) == last["reserved_bytes"]
    assert value(found, "memtop_peak_allocated_bytes", **labels) == last["peak_allocated_bytes"]
    assert value(found, "memtop_driver_used_bytes", **labels) == last["driver_used_bytes"]
    assert value(found, "memtop_steps_total", **labels) == 12
    assert value(found, "memtop_step_seconds", **labels) == pytest.approx(last["step_ms"] / 1e3)
    assert value(found, "memtop_tokens_per_second", **labels) == pytest.approx(
        last["tokens_per_s"])
    assert value(found, "memtop_loss", **labels) == pytest.approx(last["loss"])
    assert value(found, "memtop_grad_scale", **labels) is None  # no scaler: absent, not 0
    assert value(found, "memtop_leak_alert", **labels) == 0
    assert value(found, "memtop_run_state", state="finished", **labels) == 1
    assert sum(value(found, "memtop_run_state", state=s, **labels) for s in STATES) == 1
    info = next(dict(ls) for (n, ls), _ in found.items() if n == "memtop_run_info")
    assert info["amp"] == "off" and info["model"].startswith("GPT") and info["params"] == "1000"
    assert not any("gpu_uuid" in dict(ls) for _, ls in found)  # a CPU run has none


def test_help_names_the_counter_of_the_device(tmp_path):
    cpu = write_run(tmp_path / "runs" / "cpu")
    text = scrape(FolderCollector([cpu]))
    assert "# HELP memtop_allocated_bytes CPU: glibc heap in use" in text
    assert "# HELP memtop_driver_used_bytes CPU: the process's resident set size" in text
    cuda = families([_cuda_series()])
    help_of = {m.name: m.documentation for m in cuda}
    assert help_of["memtop_allocated_bytes"].startswith("CUDA caching allocator")
    assert help_of["memtop_driver_used_bytes"].startswith("NVML")
    both = {m.name: m.documentation for m in families([_cuda_series(), _cuda_series("cpu")])}
    assert "CUDA" in both["memtop_reserved_bytes"] and "CPU" in both["memtop_reserved_bytes"]


def _cuda_series(device: str = "cuda:0"):
    from probes.export.series import RankSeries

    return RankSeries("r", 0, "h", device, "running",
                      make_sample(1, device=device, scale=65536.0, data_wait_ms=1.0,
                                  forward_ms=2.0, backward_ms=3.0, optimizer_ms=4.0,
                                  other_ms=0.5),
                      gpu_uuid="GPU-0c6f3a0e-1111-2222-3333-444455556666")


def test_cuda_series_carry_gpu_uuid_the_scale_and_the_split():
    found = samples(generate_latest(_Registry(families([_cuda_series()]))).decode())
    uuid = "GPU-0c6f3a0e-1111-2222-3333-444455556666"
    assert value(found, "memtop_allocated_bytes", gpu_uuid=uuid, device="cuda:0") == 100
    assert value(found, "memtop_grad_scale", gpu_uuid=uuid) == 65536.0
    for phase, ms in (("data_wait", 1.0), ("forward", 2.0), ("backward", 3.0),
                      ("optimizer", 4.0), ("other", 0.5)):
        assert value(found, "memtop_phase_seconds", phase=phase) == pytest.approx(ms / 1e3)


class _Registry:
    """A collector that hands fixed families to generate_latest."""

    def __init__(self, fams):
        self.fams = fams

    def collect(self):
        return self.fams


def test_junk_truncated_and_nan_rows_are_counted_never_exported(tmp_path):
    run = open_run(tmp_path / "run")
    append(run, make_sample(1, allocated_bytes=111))
    with open(run / METRICS, "a") as fh:
        fh.write("{not json\n")
        fh.write(json.dumps({"step": 2, "time_s": 0.2, "loss": 1.0, "step_ms": -5.0}) + "\n")
        fh.write('{"step": 3, "time_s": 0.3, "loss": NaN, "tokens_per_s": 1.0, "step_ms": 1.0,'
                 ' "allocated_bytes": 999, "skipped_steps": 0, "amp": "off", "device": "cpu"}\n')
    collector = FolderCollector([run])
    found = samples(scrape(collector))
    assert value(found, "memtop_unreadable_rows_total") == 3
    assert value(found, "memtop_allocated_bytes") == 111  # the last readable row's
    assert value(found, "memtop_steps_total") == 1
    with open(run / METRICS, "a") as fh:  # a half-written line: waited for, not counted
        fh.write('{"step": 4, "time_s": 0.4, "loss": 1.0, "tokens_per_s"')
    time.sleep(0.06)  # past the poll interval (probes/export/collector.py POLL_EVERY_S)
    found = samples(scrape(collector))
    assert value(found, "memtop_unreadable_rows_total") == 3
    assert "NaN" not in scrape(collector) and "Inf" not in scrape(collector)


def test_a_non_finite_value_in_process_is_left_out():
    series = _cuda_series()
    from dataclasses import replace

    series = replace(series, sample=make_sample(1, loss=float("nan"), tokens_per_s=float("inf")))
    found = samples(generate_latest(_Registry(families([series]))).decode())
    assert value(found, "memtop_loss") is None and value(found, "memtop_tokens_per_second") is None
    assert value(found, "memtop_allocated_bytes") == 100


def test_a_live_run_is_running_and_a_killed_one_turns_interrupted(tmp_path):
    run = open_run(tmp_path / "runs" / "live")
    append(run, make_sample(1), make_sample(2))
    server = ControlServer(run / "control.sock", RunControl(),
                           lambda: {"pid": 1, "rank": None, "step": 2, "state": "running"},
                           lambda req: None)
    assert server.start(), server.error
    collector = FolderCollector([tmp_path / "runs"])
    try:
        found = samples(scrape(collector))
        assert value(found, "memtop_run_state", state="running") == 1
        assert value(found, "memtop_run_info", host="trainhost") == 1  # the run's own host
    finally:
        server.close()  # as a kill -9 leaves it: no run_finished, nobody answers
    wait_until(lambda: value(samples(scrape(collector)), "memtop_run_state",
                             state="interrupted") == 1, "the killed run to turn interrupted",
               poll_s=0.2)


def test_leak_alert_rate_and_time_to_full_follow_the_events(tmp_path):
    run = open_run(tmp_path / "run")
    append(run, make_sample(1), Event(R.LEAK_SUSPECTED, 1, 0.1, {
        "counter": "host_heap", "bytes_per_step": 4096.0, "since_step": 1,
        "seconds_to_full": 1200.0}))
    collector = FolderCollector([run])
    found = samples(scrape(collector))
    assert value(found, "memtop_leak_alert") == 1
    assert value(found, "memtop_leak_bytes_per_step") == 4096
    assert value(found, "memtop_seconds_to_full") == 1200
    append(run, Event(R.LEAK_FORECAST, 2, 0.2, {"counter": "host_heap",
                                                "seconds_to_full": 600.0}))
    time.sleep(0.06)
    assert value(samples(scrape(collector)), "memtop_seconds_to_full") == 600
    append(run, Event(R.LEAK_CLEARED, 3, 0.3, {"counter": "host_heap", "since_step": 3}))
    time.sleep(0.06)
    found = samples(scrape(collector))
    assert value(found, "memtop_leak_alert") == 0
    assert value(found, "memtop_seconds_to_full") is None  # absent once no alert is open


def test_new_runs_appear_ended_ones_go_after_keep_deleted_ones_at_once(tmp_path, monkeypatch):
    from probes.export import collector as C

    monkeypatch.setattr(C, "SCAN_EVERY_S", 0.0)
    root = tmp_path / "runs"
    root.mkdir()
    collector = FolderCollector([root], keep_s=3600)
    assert "memtop_steps_total{" not in scrape(collector)  # nothing yet: names only
    first = write_run(root / "20260101-000000-aaaaaa", steps=5)
    time.sleep(0.06)
    assert value(samples(scrape(collector)), "memtop_steps_total", run=first.name) == 5
    second = write_run(root / "20260101-000001-bbbbbb", steps=7)
    time.sleep(0.06)
    assert value(samples(scrape(collector)), "memtop_steps_total", run=second.name) == 7
    import shutil

    shutil.rmtree(first)  # deleted under the exporter: it goes on, without that run
    time.sleep(0.06)
    found = samples(scrape(collector))
    assert value(found, "memtop_steps_total", run=first.name) is None
    assert value(found, "memtop_steps_total", run=second.name) == 7
    collector.keep_s = 0.0  # ended runs: kept no longer
    time.sleep(0.06)
    assert value(samples(scrape(collector)), "memtop_steps_total", run=second.name) is None
    assert collector.dropped == {second}


def test_runs_that_ended_long_ago_are_never_read(tmp_path):
    old = write_run(tmp_path / "runs" / "old", steps=5)
    past = time.time() - 7200
    os.utime(old / METRICS, (past, past))
    collector = FolderCollector([tmp_path / "runs"], keep_s=600)
    assert value(samples(scrape(collector)), "memtop_steps_total") is None
    assert collector.dropped == {old} and not collector.runs


def test_a_rank_file_deleted_under_the_exporter_keeps_its_last_values(tmp_path):
    run = open_run(tmp_path / "run")
    append(run, make_sample(1, allocated_bytes=5))
    collector = FolderCollector([run])
    assert value(samples(scrape(collector)), "memtop_allocated_bytes") == 5
    (run / METRICS).unlink()
    time.sleep(0.06)
    assert value(samples(scrape(collector)), "memtop_allocated_bytes") == 5


def test_only_host_leaves_out_other_machines_ranks(tmp_path):
    run = open_run(tmp_path / "run")  # run_started says host "trainhost"
    append(run, make_sample(1))
    assert value(samples(scrape(FolderCollector([run], only_host="trainhost"))),
                 "memtop_steps_total") == 1
    assert value(samples(scrape(FolderCollector([run], only_host="elsewhere"))),
                 "memtop_steps_total") is None
    assert value(samples(scrape(FolderCollector([run], host_label="node-7"))),
                 "memtop_steps_total", host="node-7") == 1


def test_recorder_collector_reads_what_the_recorder_holds(tmp_path):
    (tmp_path / "run").mkdir()
    recorder = RunRecorder(tmp_path / "run", config={"layers": 1, "dim": 8})
    collector = RecorderCollector(recorder)
    assert "memtop_steps_total{" not in scrape(collector)
    recorder.emit(R.RUN_STARTED, 0, {"device": "cpu", "amp": "off", "params": 3})
    recorder.publish(make_sample(1, allocated_bytes=42))
    found = samples(scrape(collector))
    assert value(found, "memtop_allocated_bytes", rank="0") == 42
    assert value(found, "memtop_run_state", state="running") == 1
    recorder.emit(R.RUN_FINISHED, 1, {"reason": "interrupted (SIGINT)"})
    assert value(samples(scrape(collector)), "memtop_run_state", state="interrupted") == 1
    recorder.close()


# --- the HTTP endpoint -----------------------------------------------------------------------
def get(url: str, accept: str | None = None, method: str = "GET", context=None):
    req = urllib.request.Request(url, method=method, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as resp:
            return resp.status, resp.headers.get("Content-Type"), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, None, ""


def test_the_endpoint_serves_only_metrics_in_both_formats(tmp_path):
    run = write_run(tmp_path / "run", steps=3)
    with MetricsEndpoint(0).serve(FolderCollector([run])) as endpoint:
        assert endpoint.url.startswith("http://127.0.0.1:")
        status, ctype, text = get(endpoint.url)
        assert status == 200 and ctype.startswith("text/plain")
        assert value(samples(text), "memtop_steps_total") == 3
        status, ctype, text = get(endpoint.url, accept="application/openmetrics-text")
        assert status == 200 and ctype.startswith("application/openmetrics-text")
        assert text.rstrip().endswith("# EOF") and "memtop_steps_total" in text
        base = endpoint.url.removesuffix("/metrics")
        for path in ("/", "/favicon.ico", "/metrics/../config.json", "/run/config.json"):
            assert get(base + path)[0] == 404, path
        assert get(endpoint.url, method="POST")[0] == 405
        port = endpoint.port
    live = open_run(tmp_path / "live")
    append(live, make_sample(1))
    with MetricsEndpoint(0).serve(FolderCollector([live])) as endpoint:
        assert value(samples(get(endpoint.url)[2]), "memtop_steps_total") == 1
        append(live, make_sample(2))  # a rendering is reused for 50 ms, never longer
        wait_until(lambda: value(samples(get(endpoint.url)[2]), "memtop_steps_total") == 2,
                   "the next row in the scrape", timeout_s=10)
    probe = socket.socket()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds
    probe.bind(("127.0.0.1", port))  # closed: the port is free again
    probe.close()


def test_a_kept_connection_serves_many_scrapes_until_the_endpoint_closes(tmp_path):
    """HTTP/1.1 keep-alive, as Prometheus scrapes: one connection, many answers (gzip and
    ``name[]`` filters as prometheus_client gives them); closing the endpoint ends it."""
    import gzip
    import http.client

    run = write_run(tmp_path / "run", steps=3)
    endpoint = MetricsEndpoint(0).serve(FolderCollector([run]))
    try:
        conn = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=10)
        for _ in range(3):
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            assert resp.status == 200 and resp.getheader("Connection") != "close"
            assert value(samples(resp.read().decode()), "memtop_steps_total") == 3
        conn.request("HEAD", "/metrics")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read() == b""
        conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
        resp = conn.getresponse()
        assert resp.getheader("Content-Encoding") == "gzip"
        text = gzip.decompress(resp.read()).decode()
        assert value(samples(text), "memtop_steps_total") == 3
        conn.request("GET", "/metrics?name[]=memtop_steps_total")
        names = {s.name for s in text_string_to_metric_families(conn.getresponse().read()
                                                                 .decode())}
        assert names == {"memtop_steps"}
        conn.request("DELETE", "/metrics")
        resp = conn.getresponse()
        assert resp.status == 405 and resp.getheader("Allow") == "GET, HEAD"
        resp.read()
    finally:
        endpoint.close()
    with pytest.raises((http.client.HTTPException, OSError)):  # the kept connection is gone
        conn.request("GET", "/metrics")
        conn.getresponse()
    conn.close()


def test_tls_when_given_a_certificate_and_key(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    run = write_run(tmp_path / "run", steps=2)
    with MetricsEndpoint(0, tls_cert=str(cert), tls_key=str(key)).serve(
            FolderCollector([run])) as endpoint:
        assert endpoint.url.startswith("https://")
        context = ssl.create_default_context(cafile=str(cert))
        context.check_hostname = False
        status, _, text = get(endpoint.url, context=context)
        assert status == 200 and value(samples(text), "memtop_steps_total") == 2


def test_bad_input_is_one_line_and_exit_2_nothing_served(tmp_path):
    (tmp_path / "runs").mkdir()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        cases = {
            "already in use": ["--port", str(port)],
            "no such address": ["--port", "0", "--bind", "192.0.2.77"],
            "not an address": ["--port", "0", "--bind", "no..such..name"],
            "between 0 and 65535": ["--port", "70000"],
            "both a certificate": ["--port", "0", "--tls-cert", str(tmp_path / "c.pem")],
        }
        for words, args in cases.items():
            done = run_cli("metrics", str(tmp_path / "runs"), *args, timeout=60)
            assert done.returncode == 2, (words, done.stdout, done.stderr)
            assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1, words
            assert "serving" not in done.stdout and "Traceback" not in done.stderr
        done = run_cli("train", "--headless", "--metrics-port", str(port), "--run-dir",
                       str(tmp_path / "train"), timeout=60)
        assert done.returncode == 2 and "already in use" in done.stderr, done.stderr
        assert not (tmp_path / "train").exists()  # refused before any run folder
        done = run_cli("metrics", str(tmp_path / "nope"), "--port", "0", timeout=60)
        assert done.returncode == 2 and "does not exist" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    finally:
        taken.close()


def test_the_cli_default_keep_is_the_collectors():
    from probes.export import DEFAULT_KEEP_S
    from probes.export.server import DEFAULT_BIND
    from tui.commands import metrics

    assert metrics.DEFAULT_KEEP_S == DEFAULT_KEEP_S and metrics.DEFAULT_BIND == DEFAULT_BIND


# --- in process ----------------------------------------------------------------------------------
def test_a_monitor_serves_its_own_run_from_its_recorder(tmp_path):
    import torch

    from probes import Monitor

    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, opt, run_dir=tmp_path, tokens_per_step=4, metrics_port=0,
                 listen=False, write_report=False, ledger=False, profiler=False) as mon:
        url = mon.metrics_url
        assert url and url.startswith("http://127.0.0.1:")
        for _ in range(5):
            with mon.step() as step:
                loss = model(torch.randn(4, 8)).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                step.set(loss=loss)
        mon.recorder.drain()  # publish_soon's last batch
        found = samples(get(url)[2])
        rows = read_rows_now(mon)
        assert value(found, "memtop_steps_total") == 5
        assert value(found, "memtop_allocated_bytes") == rows[-1]["allocated_bytes"]
        assert value(found, "memtop_run_state", state="running") == 1
        started = [e for e in read_rows(mon.run_dir / METRICS).events
                   if e["event"] == R.RUN_STARTED][0]
        assert started["metrics_url"] == url
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)  # closed with the run


def read_rows_now(mon):
    mon.recorder.flush()
    return read_rows(mon.run_dir / METRICS).steps


def test_a_monitor_refuses_a_port_in_use_before_making_a_folder(tmp_path):
    import torch

    from probes import Monitor
    from probes.records import MonitorArgumentError

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        model = torch.nn.Linear(2, 2)
        with pytest.raises(MonitorArgumentError, match="already in use"):
            Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=tmp_path / "r",
                    metrics_port=taken.getsockname()[1])
        assert not (tmp_path / "r").exists()
    finally:
        taken.close()


def test_json_line_roundtrip_of_the_new_run_started_fields():
    row = json.loads(json_line(Event(R.RUN_STARTED, 0, 0.0, {
        "host": "n1", "metrics_url": "http://127.0.0.1:1/metrics",
        "system": {"gpu_uuid": "GPU-x"}}).to_json()))
    event = Event.from_json(row)
    assert event.data["host"] == "n1" and event.data["system"]["gpu_uuid"] == "GPU-x"
    assert "Prometheus: http://127.0.0.1:1/metrics" in event.summary()
