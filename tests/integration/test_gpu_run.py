"""benchmarks/gpu/check.py and benchmarks/gpu/run.sh as processes on a machine without a GPU:
the dry run lists every CUDA claim NOT RUN, and `gpu/run.sh --rehearse` runs the same script as
on the lent GPU machine (device cpu, its own OUT), so it cannot rot before its one run there
(the claims' logic: tests/unit/test_gpu_check.py); the old path benchmarks/gpu_run.sh forwards
to it."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile

import pytest
from factories import ROOT, subprocess_env

# what issue 29 asks the GPU check to claim, besides the claims it had
CLAIMS_ASKED = {
    "counters_equal_memory_stats", "ops_table_equals_key_averages", "history_off_after_run",
    "nvml_matches_fresh_read",  # the four that were wrong
    "infer_kv_bytes_on_cuda", "memory_guard_stops_before_oom", "ledger_activation_line_on_cuda",
    "graph_leak_alert_on_cuda", "sdpa_peak_below_explicit", "own_loop_on_cuda",
    "snapshot_loadable_by_memory_viz", "nccl_world_size_1", "one_sync_per_step",
    "step_overhead_default_gpt", "step_overhead_large_gpt", "nvml_minus_reserved_gap",
    "ops_table_reconciles_on_cuda", "runs_free_their_memory",
}


def test_dry_run_lists_every_claim_not_run(tmp_path):
    out = tmp_path / "gc"
    res = subprocess.run([sys.executable, "-m", "benchmarks.gpu.check", str(out), "--dry-run"],
                         capture_output=True, text=True, timeout=120, env=subprocess_env(),
                         cwd=ROOT)
    assert res.returncode == 0, res.stderr
    data = json.loads((out / "summary.json").read_text())
    names = [c["name"] for c in data["claims"]]
    assert CLAIMS_ASKED <= set(names) and len(names) == len(set(names))
    text = (out / "summary.md").read_text()
    assert text.count("**NOT RUN**") == len(names) and "**PASS**" not in text
    assert "Nothing measured" in text


@pytest.mark.slow  # a torch import, gpu_check's CPU pass and a pytest run in children
def test_gpu_run_rehearses_on_cpu_into_files_the_device_can_return(tmp_path):
    out = tmp_path / "out"
    res = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu" / "run.sh"), "--rehearse",
                          "--out", str(out)], capture_output=True, text=True, timeout=240,
                         env=subprocess_env(), cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == ["console.log", "gpu_check.json", "gpu_run.tar.gz", "pytest.txt",
                     "summary.md"]  # at most 8 plain files, no folder: what the device returns
    summary = (out / "summary.md").read_text()
    for stage in ("imports", "gpu_check", "pytest"):
        assert f"| {stage} | 0 |" in summary
    assert "Imports: all present" in summary
    claims = json.loads((out / "gpu_check.json").read_text())["claims"]
    assert CLAIMS_ASKED <= {c["name"] for c in claims}
    status = {c["name"]: c["status"] for c in claims}
    assert status["memtop_dependencies_import"] == "PASS"
    assert {s for n, s in status.items() if n != "memtop_dependencies_import"} == {"NOT RUN"}
    assert "passed" in (out / "pytest.txt").read_text()
    with tarfile.open(out / "gpu_run.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"gpu_check/summary.json", "gpu_check/results.jsonl", "gpu_check/environment.json",
            "gpu_check/gpu_check.log", "console.log", "stages.tsv"} <= names


def test_the_old_path_forwards_to_gpu_run_sh():
    """benchmarks/gpu_run.sh, the command the earlier docs name, runs benchmarks/gpu/run.sh with
    its arguments: a bad option is refused by the new script (one line, exit 2)."""
    res = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_run.sh"), "--no-such-option"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip() == ("gpu/run.sh: unknown option --no-such-option (--rehearse, "
                                  "--fetch-wheels, --out DIR)")
