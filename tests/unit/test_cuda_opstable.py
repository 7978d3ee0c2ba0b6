"""The top-ops table on a CUDA trace (tests/data/cuda_trace_small.json: one step written by hand
in Kineto's layout: record_function ranges with their gpu_user_annotation spans, cpu_ops,
cudaLaunchKernel runtime calls and kernels linked by "External id")."""

from __future__ import annotations

import pytest
from factories import DATA

from probes.traces.chrome_trace import aggregate, load_trace
from probes.traces.opstable import analyse, phase_totals, rank_rows, sort_rows

TRACE = DATA / "cuda_trace_small.json"


def test_annotation_spans_would_top_a_plain_device_sort():
    rows = aggregate(load_trace(TRACE), use_device=True)
    assert sort_rows(rows, "device")[0]["name"] == "ProfilerStep*"  # what the fix is for


def test_device_ranking_holds_ops_and_kernels_only():
    rows = rank_rows(aggregate(load_trace(TRACE), use_device=True), "device")
    names = [r["name"] for r in rows]
    assert not {"ProfilerStep*", "forward", "backward", "optimizer"} & set(names)
    top = {r["name"]: r["self_device_us"] for r in rows[:3]}
    assert top == {"aten::mm": pytest.approx(360.0),
                   "sm90_xmma_gemm_f16f16_f32_bwd": pytest.approx(240.0),
                   "sm90_xmma_gemm_f16f16_f32_fwd": pytest.approx(120.0)}
    mm = next(r for r in rows if r["name"] == "aten::mm")
    assert mm["calls"] == 2 and mm["self_cpu_us"] == pytest.approx(90.0)  # 110 - 2 launches


def test_phase_totals_pair_host_ranges_with_device_spans():
    phases = {p["name"]: p for p in phase_totals(aggregate(load_trace(TRACE), use_device=True))}
    assert set(phases) == {"ProfilerStep*", "forward", "backward", "optimizer"}
    assert phases["ProfilerStep*"]["cpu_total_us"] == pytest.approx(1000.0)
    assert phases["ProfilerStep*"]["device_span_us"] == pytest.approx(835.0)
    assert phases["forward"]["device_span_us"] == pytest.approx(145.0)
    assert phases["backward"]["cpu_total_us"] == pytest.approx(300.0)
    assert phases["optimizer"]["calls"] == 1


def test_analyse_writes_the_phases_beside_the_table(tmp_path):
    result = analyse(TRACE, tmp_path, sort_by="device", use_device=True)
    assert result["top_ops"][0]["name"] == "aten::mm"
    assert [p["name"] for p in result["phases"]][0] == "ProfilerStep*"
    text = (tmp_path / "top_ops.txt").read_text()
    assert "Phase (user annotation)" in text and "835 µs" in text


def test_cpu_ranking_is_unchanged():
    rows = rank_rows(aggregate(load_trace(TRACE), use_device=False), "cpu")
    names = [r["name"] for r in rows]
    assert names[0] == "backward"  # by self CPU time a range stays an entry: 300 - 60 us
    assert "ProfilerStep*" in names
