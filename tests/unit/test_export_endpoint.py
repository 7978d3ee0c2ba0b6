"""The exporter's HTTP endpoint (probes/export/server.py): only /metrics in both formats, a
kept connection serving many scrapes, TLS, bad input as one line and exit 2, and a Monitor's
in-process endpoint. Real sockets and HTTP."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import urllib.error
import urllib.request

import pytest
from factories import make_sample, run_cli, wait_until, write_run
from prometheus_client.parser import text_string_to_metric_families
from scrapes import append, open_run, samples, value

from probes import records as R
from probes.export import FolderCollector, MetricsEndpoint
from probes.records import Event
from probes.runfolder import METRICS, json_line, read_rows


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


def test_a_scraper_that_hangs_up_or_a_failing_collector_prints_nothing(tmp_path, capfd):
    """A connection reset mid-request leaves no traceback on the terminal (an in-process
    endpoint's is the training's); a collector that raises answers 500 with one line."""
    class Broken:
        def collect(self):
            raise RuntimeError("no rows")

    with MetricsEndpoint(0).serve(FolderCollector([write_run(tmp_path / "run", steps=1)])) \
            as endpoint:
        sock = socket.create_connection(("127.0.0.1", endpoint.port))
        sock.sendall(b"GET /metr")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()  # RST mid-request
        assert get(endpoint.url)[0] == 200  # and it goes on serving
    with MetricsEndpoint(0).serve(Broken()) as endpoint:
        status, _, _ = get(endpoint.url)
        assert status == 500
    assert "Traceback" not in capfd.readouterr().err
