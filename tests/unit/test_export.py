"""The Prometheus exporter over run folders (probes/export/): every name with its labels, the
run folder's values, what is never exported (junk lines, NaN), the run's state word (a killed
run turns interrupted), new, ended and deleted runs. Real files; the HTTP endpoint and a
Monitor's in-process one are test_export_endpoint.py's, the real Prometheus scraping them
tests/integration/test_prometheus.py's."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest
from factories import make_sample, wait_until, write_run
from prometheus_client import generate_latest
from scrapes import append, open_run, samples, scrape, value

from probes import records as R
from probes.control.requests import RunControl
from probes.control.unix_socket import ControlServer
from probes.export import FolderCollector, families
from probes.export.collector import RecorderCollector
from probes.export.names import EXPORTED, STATES
from probes.records import Event
from probes.runfolder import METRICS, RunRecorder, read_rows

# the issue's list of names, written out: names.py must export exactly these
NAMES = ["memtop_allocated_bytes", "memtop_reserved_bytes", "memtop_peak_allocated_bytes",
         "memtop_driver_used_bytes", "memtop_steps_total", "memtop_step_seconds",
         "memtop_tokens_per_second", "memtop_loss", "memtop_grad_scale",
         "memtop_skipped_steps_total", "memtop_phase_seconds", "memtop_leak_alert",
         "memtop_leak_bytes_per_step", "memtop_seconds_to_full", "memtop_run_info",
         "memtop_run_state", "memtop_unreadable_rows_total"]


def test_the_exported_names_are_the_issues():
    assert sorted(EXPORTED) == sorted(NAMES)


@pytest.fixture
def every_scrape_reads(monkeypatch):
    """The folder collector reads its files at every scrape (not at most every POLL_EVERY_S):
    a test sees a row it just wrote without waiting out the interval."""
    from probes.export import collector as C

    monkeypatch.setattr(C, "POLL_EVERY_S", 0.0)


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


def test_junk_truncated_and_nan_rows_are_counted_never_exported(tmp_path, every_scrape_reads):
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


def test_leak_alert_rate_and_time_to_full_follow_the_events(tmp_path, every_scrape_reads):
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
    assert value(samples(scrape(collector)), "memtop_seconds_to_full") == 600
    append(run, Event(R.LEAK_CLEARED, 3, 0.3, {"counter": "host_heap", "since_step": 3}))
    found = samples(scrape(collector))
    assert value(found, "memtop_leak_alert") == 0
    assert value(found, "memtop_seconds_to_full") is None  # absent once no alert is open


def test_new_runs_appear_ended_ones_go_after_keep_deleted_ones_at_once(tmp_path, monkeypatch,
                                                                       every_scrape_reads):
    from probes.export import collector as C

    monkeypatch.setattr(C, "SCAN_EVERY_S", 0.0)  # and every scrape reads (the fixture)
    root = tmp_path / "runs"
    root.mkdir()
    collector = FolderCollector([root], keep_s=3600)
    assert "memtop_steps_total{" not in scrape(collector)  # nothing yet: names only
    first = write_run(root / "20260101-000000-aaaaaa", steps=5)
    assert value(samples(scrape(collector)), "memtop_steps_total", run=first.name) == 5
    second = write_run(root / "20260101-000001-bbbbbb", steps=7)
    assert value(samples(scrape(collector)), "memtop_steps_total", run=second.name) == 7
    import shutil

    shutil.rmtree(first)  # deleted under the exporter: it goes on, without that run
    found = samples(scrape(collector))
    assert value(found, "memtop_steps_total", run=first.name) is None
    assert value(found, "memtop_steps_total", run=second.name) == 7
    collector.keep_s = 0.0  # ended runs: kept no longer
    assert value(samples(scrape(collector)), "memtop_steps_total", run=second.name) is None
    assert collector.dropped == {second}


def test_runs_that_ended_long_ago_are_never_read(tmp_path):
    old = write_run(tmp_path / "runs" / "old", steps=5)
    past = time.time() - 7200
    os.utime(old / METRICS, (past, past))
    collector = FolderCollector([tmp_path / "runs"], keep_s=600)
    assert value(samples(scrape(collector)), "memtop_steps_total") is None
    assert collector.dropped == {old} and not collector.runs


def test_a_rank_file_deleted_under_the_exporter_keeps_its_last_values(tmp_path,
                                                                      every_scrape_reads):
    run = open_run(tmp_path / "run")
    append(run, make_sample(1, allocated_bytes=5))
    collector = FolderCollector([run])
    assert value(samples(scrape(collector)), "memtop_allocated_bytes") == 5
    (run / METRICS).unlink()
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
