"""benchmarks/gpu_check.py's pure parts on a machine without a GPU: per-step sync counts, timing
agreement and the claim table compute what they say (its dry run, every CUDA claim NOT RUN:
tests/integration/test_gpu_check_dry_run.py)."""

from __future__ import annotations

import pytest
from factories import import_benchmark


def test_per_step_sync_counts():
    per_step_counts = import_benchmark("gpu_check_cuda").per_step_counts

    # running totals of sync warnings when each step began; the last step has no successor
    assert per_step_counts({1: 0, 2: 3, 3: 4, 4: 5}) == {1: 3, 2: 1, 3: 1}
    assert per_step_counts({}) == {}


def test_step_time_agreement():
    agreement = import_benchmark("gpu_check_cuda").agreement

    got = agreement([10.0, 11.0, 30.0], [10.0, 10.0, 0.0])  # a step without an event time
    assert got["steps"] == 2 and got["median_ratio"] == pytest.approx(1.05)
    assert agreement([1.0], [0.0]) is None


def test_claim_table_marks_unmeasured_claims():
    gpu_check = import_benchmark("gpu_check")

    r = gpu_check.Result("sync_count")
    r.claim("one_sync_per_step", True, "median 1")
    r.claim("sync_counting_works", False, "no difference")
    rows = {(c, t.split()[0]): (st, d) for c, t, st, d in gpu_check.claim_rows([r])}
    assert rows[("sync_count", "memtop's")] == ("PASS", "median 1")
    assert rows[("sync_count", "set_sync_debug_mode")][0] == "FAIL"
    assert rows[("sync_count", "step_ms")][0] == "NOT RUN"
    assert all(st == "NOT RUN" for (c, _), (st, _) in rows.items() if c != "sync_count")
    assert r.finish().status == "fail"
