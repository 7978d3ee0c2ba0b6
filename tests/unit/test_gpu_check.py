"""benchmarks/gpu_check.py on a machine without a GPU: it imports, its dry run lists every CUDA
claim as NOT RUN, and its pure parts (per-step sync counts, timing agreement, claim table)
compute what they say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))


def test_dry_run_lists_every_claim_not_run(tmp_path):
    out = tmp_path / "gc"
    res = subprocess.run([sys.executable, str(BENCH / "gpu_check.py"), str(out), "--dry-run"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    text = (out / "summary.md").read_text()
    import gpu_check

    n_claims = sum(len(v) for v in gpu_check.CLAIMS.values())
    assert text.count("**NOT RUN**") == n_claims >= 15
    assert "PASS" not in text and "nothing measured" in text


def test_per_step_sync_counts():
    from gpu_check_cuda import per_step_counts

    # running totals of sync warnings when each step began; the last step has no successor
    assert per_step_counts({1: 0, 2: 3, 3: 4, 4: 5}) == {1: 3, 2: 1, 3: 1}
    assert per_step_counts({}) == {}


def test_step_time_agreement():
    from gpu_check_cuda import agreement

    got = agreement([10.0, 11.0, 30.0], [10.0, 10.0, 0.0])  # a step without an event time
    assert got["steps"] == 2 and got["median_ratio"] == pytest.approx(1.05)
    assert agreement([1.0], [0.0]) is None


def test_claim_table_marks_unmeasured_claims():
    import gpu_check

    r = gpu_check.Result("sync_count")
    r.claim("one_sync_per_step", True, "median 1")
    r.claim("sync_counting_works", False, "no difference")
    rows = {(c, t.split()[0]): (st, d) for c, t, st, d in gpu_check.claim_rows([r])}
    assert rows[("sync_count", "memtop's")] == ("PASS", "median 1")
    assert rows[("sync_count", "set_sync_debug_mode")][0] == "FAIL"
    assert rows[("sync_count", "step_ms")][0] == "NOT RUN"
    assert all(st == "NOT RUN" for (c, _), (st, _) in rows.items() if c != "sync_count")
    assert r.finish().status == "fail"
