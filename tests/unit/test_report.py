"""The experiment report: every field present and consistent with metrics.jsonl, MFU on recorded
GPU rows, junk values read as n/a, concurrent writers (a killed run reported as incomplete, and
`memtop report` on bad input: tests/integration/test_report_cli.py)."""

from __future__ import annotations

import json
import re
import statistics

import pytest
from factories import TINY, copy_run, metrics_rows, resolved_amp, run_digests, write_junk_run

from probes.analysis.report import build_report, peak_flops, write_report
from probes.analysis.report.sections.setup import sync_rule
from probes.tools.stats import percentile
from tui.cli import main as cli_main

FIELDS = {
    "hardware": ("device", "device_name", "cpu_model", "cpu_count", "ram_bytes"),
    "software": ("python", "torch", "cuda", "cudnn", "memtop"),
    "model": ("layers", "dim", "heads", "vocab", "params"),
    "input": ("batch_size", "seq_len", "token_dtype", "param_dtype", "compute_dtype"),
    "measurement": ("steps", "sync_rule", "timing", "counters"),
    "results": ("final_loss", "recent_loss", "tokens_per_s_p50", "step_ms_p50", "step_ms_p95",
                "peak_allocated_bytes", "peak_reserved_bytes", "driver_peak_bytes",
                "skipped_steps", "mfu", "mfu_note", "flops_per_token"),
}


def test_every_run_ends_with_a_report_consistent_with_metrics(finished_run):
    report = json.loads((finished_run / "report.json").read_text())
    assert (finished_run / "report.md").is_file()
    for section, keys in FIELDS.items():
        for key in keys:
            assert key in report[section], f"{section}.{key}"
    # what this run resolved (MEMTOP_CPU_BF16 may stand in for the CPU's flags), not the CPU
    assert report["mode"] == "train" and report["amp"] == resolved_amp(finished_run)
    assert report["warmup_steps"] == TINY["warmup_steps"]
    assert report["complete"] is True and report["incomplete_reasons"] == []
    rule = report["measurement"]["sync_rule"]  # a CPU run: no device to wait for
    assert rule.startswith("none needed: on CPU") and "GradScaler.step" not in rule
    cuda_rule = sync_rule("cuda:0")
    assert "loss, gradient norm and GradScaler scale" in cuda_rule and "fused AdamW" in cuda_rule
    assert "GradScaler.step" in cuda_rule and ".item()" in cuda_rule  # not "the only host sync"
    assert "only" not in cuda_rule
    assert report["model"]["vocab"] == 256

    steps, events = metrics_rows(finished_run)
    res = report["results"]
    assert report["measurement"]["steps"] == res["steps_recorded"] == len(steps) == 12
    assert res["final_loss"] == steps[-1]["loss"]
    assert res["recent_loss"] == pytest.approx(statistics.fmean(r["loss"] for r in steps[-10:]))
    timed = [r for r in steps if r["step"] > TINY["warmup_steps"] and not r["profiling"]]
    assert res["stats_steps"] == len(timed)
    assert res["tokens_per_s_p50"] == pytest.approx(
        statistics.median(r["tokens_per_s"] for r in timed))
    assert res["step_ms_p50"] == pytest.approx(statistics.median(r["step_ms"] for r in timed))
    assert res["step_ms_p50"] <= res["step_ms_p95"] <= max(r["step_ms"] for r in timed)
    # the peak's rule (probes/analysis/measured.py peak_steps): after the warm-up row, whose
    # peak is the warm-up's (the reset runs once that row is read)
    assert res["peak_allocated_bytes"] == max(
        r["peak_allocated_bytes"] for r in steps if r["step"] > TINY["warmup_steps"])
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
    assert "GPT: 1 layer, dim 32, 2 heads," in md  # the tiny run's shape, in words
    # a CPU run's peaks under the panes' names for them (probes/records/names.py), not CUDA's
    for name in ("peak heap used", "peak heap held", "peak RSS"):
        assert f"| {name} " in md
    assert "peak allocated" not in md.lower() and "driver-level peak" not in md
    assert "Peak heap used: max of the sampled heap readings" in md
    assert "MiB heap used at the end of forward" in report["finding"]


def test_percentile_is_numpy_linear():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10.0], 95) == 10.0
    assert percentile(list(range(101)), 95) == 95
    assert percentile([], 50) is None


def test_report_again_replaces_only_derived_files(finished_run, tmp_path, capsys):
    run_dir = copy_run(finished_run, tmp_path / "again")
    before = run_digests(run_dir)
    assert cli_main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out.splitlines()  # where the report is, then what it found
    assert out[0].startswith("memtop: report ") and out[1].startswith("  The run finished")
    assert all(len(line) <= 100 for line in out[1:])  # wrapped to the terminal, at most 100
    first = write_report(run_dir)
    second = write_report(run_dir)
    assert first == second == run_dir / "report.md"
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "config.json", "metrics.jsonl", "report.json", "report.md"]
    assert before == run_digests(run_dir)


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
    assert re.search(r"\| peak allocated +\| +1006 B \|", md) and "| peak NVML used " in md


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
    run_dir = write_junk_run(tmp_path, started, extra, tail)
    assert cli_main(["report", str(run_dir)]) == 0, capsys.readouterr().err
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("memtop: report ")
    assert expect in (run_dir / "report.md").read_text()
    if case == "nested_brackets":
        report = json.loads((run_dir / "report.json").read_text())
        assert report["rows"]["unreadable"] == 1 and not report["complete"]


def test_concurrent_writers_are_serialised(finished_run, tmp_path):
    """`r` twice, or `r` with the quit thread: several threads write the same run's report."""
    import threading

    run_dir = copy_run(finished_run, tmp_path / "busy")
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


def test_runs_and_the_report_say_the_same_throughput(finished_run):
    """issue 30: `memtop runs` showed the last step's tok/s beside the report's p50; both now
    use throughput_p50, and a run without its report computes the same figure from its rows."""
    from probes.analysis.measured import throughput_p50
    from probes.analysis.runlist import summarize_run

    report = json.loads((finished_run / "report.json").read_text())
    p50 = report["results"]["tokens_per_s_p50"]
    assert summarize_run(finished_run, ping=False).throughput == pytest.approx(p50)
    steps, _ = metrics_rows(finished_run)
    assert throughput_p50(steps, report["warmup_steps"]) == (pytest.approx(p50), "tok/s")


def test_a_leak_in_the_finding_names_its_counter_in_words(tmp_path):
    """The finding said "host_heap grew"; the dashboard's banner says what that counter is."""
    alert = {"event": "leak_suspected", "step": 4, "time_s": 0.4, "counter": "host_heap",
             "bytes_per_step": 153600, "since_step": 2}
    report = build_report(write_junk_run(tmp_path, {}, [alert], ""))
    assert "host heap in use (mallinfo2) grew 150 KiB/step since step 2" in report["finding"]
    assert "host_heap" not in report["finding"]
