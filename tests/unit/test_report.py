"""The experiment report: every field present and consistent with metrics.jsonl, a killed run
reported as incomplete, and `memtop report` on bad input: one line, exit 2, nothing touched."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TINY, run_cli, wait_until

from probes.analysis.report import ReportError, build_report, peak_flops, write_report
from probes.tools.stats import percentile
from tui.cli import main as cli_main

FIELDS = {
    "hardware": ("device", "device_name", "cpu_model", "cpu_count", "ram_bytes"),
    "software": ("python", "torch", "cuda", "cudnn", "memtop"),
    "model": ("layers", "dim", "heads", "vocab", "params"),
    "input": ("batch_size", "seq_len", "token_dtype", "param_dtype", "compute_dtype"),
    "measurement": ("steps", "sync_rule", "timing", "counters"),
    "results": ("final_loss", "mean_loss", "tokens_per_s_p50", "step_ms_p50", "step_ms_p95",
                "peak_allocated_bytes", "peak_reserved_bytes", "driver_peak_bytes",
                "skipped_steps", "mfu", "mfu_note", "flops_per_token"),
}


def _rows(run_dir: Path) -> tuple[list[dict], list[dict]]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    return [r for r in rows if "event" not in r], [r for r in rows if "event" in r]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """One real headless run (finish_run writes the report at its end), shared by the tests."""
    from trainer.config import TrainConfig
    from tui.headless import run_headless

    root = tmp_path_factory.mktemp("runs")
    config = TrainConfig(**dict(TINY, steps=12, run_dir=str(root)))
    from probes.runfolder import create_run_dir

    run_dir = create_run_dir(root)
    out = io.StringIO()
    assert run_headless(config, run_dir, log_every=100, out=out) == 0
    assert "memtop: report" in out.getvalue()
    return run_dir


def test_every_run_ends_with_a_report_consistent_with_metrics(finished_run):
    report = json.loads((finished_run / "report.json").read_text())
    assert (finished_run / "report.md").is_file()
    for section, keys in FIELDS.items():
        for key in keys:
            assert key in report[section], f"{section}.{key}"
    assert report["mode"] == "train" and report["amp"] == "bf16"
    assert report["warmup_steps"] == TINY["warmup_steps"]
    assert report["complete"] is True and report["incomplete_reasons"] == []
    rule = report["measurement"]["sync_rule"]
    assert "loss, gradient norm and GradScaler scale" in rule and "fused AdamW" in rule
    assert "GradScaler.step" in rule and ".item()" in rule  # not "the only host sync"
    assert "only" not in rule
    assert report["model"]["vocab"] == 256

    steps, events = _rows(finished_run)
    res = report["results"]
    assert report["measurement"]["steps"] == res["steps_recorded"] == len(steps) == 12
    assert res["final_loss"] == steps[-1]["loss"]
    assert res["mean_loss"] == pytest.approx(statistics.fmean(r["loss"] for r in steps))
    timed = [r for r in steps if r["step"] > TINY["warmup_steps"] and not r["profiling"]]
    assert res["stats_steps"] == len(timed)
    assert res["tokens_per_s_p50"] == pytest.approx(
        statistics.median(r["tokens_per_s"] for r in timed))
    assert res["step_ms_p50"] == pytest.approx(statistics.median(r["step_ms"] for r in timed))
    assert res["step_ms_p50"] <= res["step_ms_p95"] <= max(r["step_ms"] for r in timed)
    assert res["peak_allocated_bytes"] == max(
        r["peak_allocated_bytes"] for r in steps if r["step"] >= TINY["warmup_steps"])
    assert res["driver_peak_bytes"] == max(r["driver_used_bytes"] for r in steps)
    assert res["skipped_steps"] == steps[-1]["skipped_steps"]
    assert res["mfu"] is None and "CPU" in res["mfu_note"]  # no peak FLOP/s table for CPUs
    started = next(e for e in events if e["event"] == "run_started")
    params, cfg = started["params"], TINY
    assert report["model"]["params"] == params
    assert res["flops_per_token"] == 6 * (params - cfg["block_size"] * cfg["dim"]) + \
        12 * cfg["layers"] * cfg["dim"] * cfg["seq_len"]
    assert report["software"]["source"] == "run start"  # recorded by the trainer
    ledger = [e for e in events if e["event"] == "ledger"][-1]
    assert report["ledger"]["lines"] == ledger["lines"]
    assert report["profiles"] == [] and isinstance(report["leaks"], list)
    assert "largest ledger line" in report["finding"]
    md = (finished_run / "report.md").read_text()
    for heading in ("## Finding", "## Setup", "## Results", "## Memory ledger",
                    "## Profiler windows", "## Leak and memory events"):
        assert heading in md
    assert "| metric" in md and "| saved activations" in md


def test_percentile_is_numpy_linear():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10.0], 95) == 10.0
    assert percentile(list(range(101)), 95) == 95
    assert percentile([], 50) is None


def test_killed_run_gets_an_incomplete_report(tmp_path):
    """A real run killed with SIGKILL mid-way, then a half-written last line."""
    root = tmp_path / "runs"
    args = ["train", "--headless", "--device", "cpu", "--steps", "0", "--run-dir", str(root),
            "--log-every", "1000"]
    for key in ("layers", "heads", "dim", "seq_len", "block_size", "batch_size", "warmup_steps"):
        args += [f"--{key.replace('_', '-')}", str(TINY[key])]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "tui.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def ledger_written():
        found = list(root.glob("*/metrics.jsonl"))
        return found[0] if found and '"event":"ledger"' in found[0].read_text() else None

    try:
        metrics = wait_until(ledger_written, "the run's ledger row", poll_s=0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    run_dir = metrics.parent
    report = build_report(run_dir)
    assert report["complete"] is False
    assert "no run_finished row" in report["incomplete_reasons"][0]
    steps, _ = _rows(run_dir)
    assert report["results"]["steps_recorded"] == len(steps) >= 3
    assert report["ledger"] is not None

    with open(metrics, "a", encoding="utf-8") as fh:
        fh.write('{"step": 99999, "time_s": 1.0, "lo')  # killed while writing this line
    before = {name: _digest(run_dir / name) for name in ("config.json", "metrics.jsonl")}
    result = run_cli("report", str(run_dir))
    assert result.returncode == 0, result.stderr
    report = json.loads((run_dir / "report.json").read_text())
    assert any("cut short" in r for r in report["incomplete_reasons"])
    assert report["results"]["steps_recorded"] == len(steps)
    assert "Incomplete run" in (run_dir / "report.md").read_text()
    assert "incomplete run" in result.stdout
    assert before == {name: _digest(run_dir / name) for name in ("config.json", "metrics.jsonl")}


def _copy_run(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in ("config.json", "metrics.jsonl"):
        (dst / name).write_bytes((src / name).read_bytes())
    return dst


@pytest.mark.parametrize("case", ["missing", "no_metrics", "junk_metrics", "empty_metrics",
                                  "config_not_json", "config_bad_field", "is_a_file"])
def test_report_on_bad_input_is_one_line_and_exit_2(finished_run, tmp_path, case):
    run_dir = tmp_path / "run"
    if case == "missing":
        pass
    elif case == "is_a_file":
        run_dir.write_text("not a folder")
    else:
        _copy_run(finished_run, run_dir)
        if case == "no_metrics":
            (run_dir / "metrics.jsonl").unlink()
        elif case == "junk_metrics":
            (run_dir / "metrics.jsonl").write_bytes(os.urandom(4096) + b"\n[1, 2]\n{oops\n")
        elif case == "empty_metrics":
            (run_dir / "metrics.jsonl").write_bytes(b"")
        elif case == "config_not_json":
            (run_dir / "config.json").write_text("{ batch_size: 4")
        elif case == "config_bad_field":
            config = json.loads((run_dir / "config.json").read_text())
            config["seq_len"] = "sixteen"
            (run_dir / "config.json").write_text(json.dumps(config))
    before = {p.name: _digest(p) for p in run_dir.iterdir()} if run_dir.is_dir() else None
    result = run_cli("report", str(run_dir), timeout=60)
    assert result.returncode == 2, (case, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memtop report: "), result.stderr
    assert "Traceback" not in result.stderr
    if before is not None:  # nothing written, nothing changed
        assert before == {p.name: _digest(p) for p in run_dir.iterdir()}
    with pytest.raises(ReportError):
        build_report(run_dir)


def test_report_again_replaces_only_derived_files(finished_run, tmp_path):
    run_dir = _copy_run(finished_run, tmp_path / "again")
    before = {name: _digest(run_dir / name) for name in ("config.json", "metrics.jsonl")}
    first = write_report(run_dir)
    second = write_report(run_dir)
    assert first == second == run_dir / "report.md"
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "config.json", "metrics.jsonl", "report.json", "report.md"]
    assert before == {name: _digest(run_dir / name) for name in ("config.json", "metrics.jsonl")}


def test_mfu_on_a_known_gpu_and_a_failed_run(tmp_path):
    """Rows as a CUDA run on an H100 writes them (this machine has no GPU to make them)."""
    run_dir = tmp_path / "gpu"
    run_dir.mkdir()
    config = dict(TINY, device="cuda", amp="auto", resolved_amp="fp16", steps=6)
    (run_dir / "config.json").write_text(json.dumps(config))
    params = 21984
    rows = [{"event": "run_started", "step": 0, "time_s": 0.0, "device": "cuda:0",
             "device_name": "NVIDIA H100 80GB HBM3", "amp": "fp16", "params": params}]
    for step in range(1, 7):
        rows.append({"step": step, "time_s": step * 0.01, "loss": 5.0 - step / 10,
                     "tokens_per_s": 1000.0 * step, "step_ms": 10.0 - step, "profiling": False,
                     "peak_allocated_bytes": 1000 + step, "reserved_bytes": 4096,
                     "driver_used_bytes": 8192, "skipped_steps": max(0, step - 4),
                     "allocated_bytes": 1000, "alloc_retries": 1, "ooms": 0})
    rows.append({"event": "error", "step": 6, "time_s": 0.07, "error_type": "OutOfMemoryError",
                 "message": "CUDA out of memory"})
    rows.append({"event": "run_finished", "step": 6, "time_s": 0.08, "reason": "failed"})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = build_report(run_dir)
    res = report["results"]
    assert res["tokens_per_s_p50"] == 4500.0  # steps 3..6 after warmup 2
    assert (res["cache_free_bytes"], res["alloc_retries"], res["ooms"]) == (3096, 1, 0)
    assert res["driver_minus_reserved_bytes"] == 8192 - 4096
    assert "retried" in res["allocator_hint"]
    flops = 6 * (params - TINY["block_size"] * TINY["dim"]) + \
        12 * TINY["layers"] * TINY["dim"] * TINY["seq_len"]
    assert res["device_peak_flops_per_s"] == 989e12
    assert res["mfu"] == pytest.approx(flops * 4500.0 / 989e12)
    assert res["skipped_steps"] == 2 and res["peak_allocated_bytes"] == 1006
    assert report["complete"] and report["status"]["reason"] == "failed"
    assert "OutOfMemoryError" in report["finding"] and "skipped" in report["finding"]
    assert report["software"]["source"].startswith("report time")
    write_report(run_dir)
    md = (run_dir / "report.md").read_text()
    assert "## Errors" in md and re.search(r"\| cudaMalloc retries \/ OOMs +\| +1 \/ 0 \|", md)


@pytest.mark.parametrize(("name", "figure"), [
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H200", 989e12), ("NVIDIA H200 NVL", 835e12), ("NVIDIA GH200 480GB", 989e12),
    ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA A10", 125e12), ("NVIDIA L4", 121e12),
    ("NVIDIA A100 80GB PCIe", 312e12), ("NVIDIA A800-SXM4-80GB", 312e12), ("NVIDIA H800", 989e12),
    ("NVIDIA H800 PCIe", 756e12), ("Tesla T4", None), ("NVIDIA L40S", 362e12),
    ("NVIDIA GeForce RTX 4090", 165e12), ("NVIDIA RTX A1000", None), ("NVIDIA RTX A1000 6GB", None),
    ("NVIDIA L40", None), ("NVIDIA A10G", None), ("NVIDIA GeForce RTX 4090 D", None)])
def test_peak_flops_picks_each_gpus_own_figure(name, figure):
    assert peak_flops(name, "bf16")[0] == figure


def test_peak_flops_skips_mig_slices():
    fig, why = peak_flops("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "bf16")
    assert fig is None and "MIG slice" in why
    fig, why = peak_flops("NVIDIA H100 80GB HBM3", "fp16", mig=True)
    assert fig is None and "MIG slice" in why
    assert peak_flops("Tesla T4", "fp16")[0] == 65e12


def _junk_run(tmp_path: Path, started: dict, extra: list, tail: str = "") -> Path:
    """A run folder whose rows parse as JSON but hold values of the wrong type."""
    run_dir = tmp_path / "junk"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(dict(TINY, steps=5)))
    rows = [{"event": "run_started", "step": 0, "time_s": 0.0, "device": "cpu",
             "device_name": "CPU", "amp": "bf16", "params": 21984,
             "system": {"cpu_model": "test CPU", "cpu_count": 2, "ram_bytes": 2**30}, **started}]
    rows += [{"step": s, "time_s": s / 10, "loss": 5.0 - s / 10, "tokens_per_s": 640.0,
              "step_ms": 100.0, "peak_allocated_bytes": 4096, "reserved_bytes": 8192,
              "driver_used_bytes": 2**20, "skipped_steps": 0} for s in range(1, 6)]
    rows += extra + [{"event": "run_finished", "step": 5, "time_s": 0.6, "reason": "finished"}]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (run_dir / "metrics.jsonl").write_text(text + tail)
    return run_dir


LEDGER = {"event": "ledger", "step": 3, "sampled_step": 3, "total_measured_bytes": 0,
          "allocated_bytes": 4096}
JUNK = {
    "device_name_int": ({"device_name": 5}, [], "RAM 1.0 GiB"),
    "ram_bytes_str": ({"system": {"cpu_model": "x", "ram_bytes": "x"}}, [], "RAM n/a"),
    "system_list": ({"system": [1, 2]}, [], "## Setup"),
    "ledger_lines_ints": ({}, [dict(LEDGER, lines=[1, 2])], "## Memory ledger"),
    "ledger_lines_junk": ({}, [dict(LEDGER, lines=[{"name": 3, "measured_bytes": "7"},
                                                   {"name": "parameters", "measured_bytes": 0}],
                                    model=[1])], "| parameters"),
    "bytes_per_step_str": ({}, [{"event": "leak_suspected", "step": 4, "counter": "host_heap",
                                 "bytes_per_step": "x", "since_step": [2],
                                 "seconds_to_full": "soon"}], "leak_suspected"),
    "top_ops_junk": ({}, [{"event": "profile_done", "step": 4, "top_ops": [7, {"name": 1,
                                                                             "calls": "x"}]}],
                     "## Profiler windows"),
    "nested_brackets": ({}, [], "cut short"),
}


@pytest.mark.parametrize("case", sorted(JUNK))
def test_report_ignores_wrongly_typed_values(tmp_path, capsys, case):
    """Type junk from a foreign or hand-edited file: the report still comes out, junk as n/a."""
    started, extra, expect = JUNK[case]
    tail = "[" * 100_000 + "\n" if case == "nested_brackets" else ""  # RecursionError in json
    run_dir = _junk_run(tmp_path, started, extra, tail)
    assert cli_main(["report", str(run_dir)]) == 0, capsys.readouterr().err
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("memtop: report ")
    assert expect in (run_dir / "report.md").read_text()
    if case == "nested_brackets":
        report = json.loads((run_dir / "report.json").read_text())
        assert report["rows"]["unreadable"] == 1 and not report["complete"]


def test_report_on_unforeseen_content_is_one_line_and_exit_2(tmp_path):
    """A params count too large for a float passes every type check and then overflows: the
    catch-all turns what would be a crash (exit 1) into one line and exit 2."""
    run_dir = _junk_run(tmp_path, {"params": 10**400}, [])
    result = run_cli("report", str(run_dir), timeout=60)
    assert result.returncode in (0, 2), result.stderr  # 0 once such a value is checked too
    assert "Traceback" not in result.stderr
    if result.returncode == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("memtop report: "), result.stderr
        assert not (run_dir / "report.md").exists()


def test_concurrent_writers_are_serialised(finished_run, tmp_path):
    """`r` twice, or `r` with the quit thread: several threads write the same run's report."""
    import threading

    run_dir = _copy_run(finished_run, tmp_path / "busy")
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for _ in range(5):
                write_report(run_dir)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "config.json", "metrics.jsonl", "report.json", "report.md"]
    json.loads((run_dir / "report.json").read_text())
    assert (run_dir / "report.md").read_text().startswith("# memtop report")
