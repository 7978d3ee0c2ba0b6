"""Several ranks on paper: the rank table fits 80x24 for 2 to 8 ranks, and a failure names the rank
that raised, not the peer left waiting (real torchrun runs: tests/integration/test_ranks.py)."""

from __future__ import annotations

from factories import make_sample

from probes.analysis.ranks import ProcessExit, RankEnd, failure_text, process_exits
from probes.records import StepSample
from tui.widgets.rank_table import RankRow, rank_table_lines


def test_rank_table_fits_80x24_for_2_to_8_ranks():
    def sample(rank: int) -> StepSample:  # the higher the rank, the slower and the bigger
        return make_sample(9, tokens_per_s=1000.0 + rank, step_ms=20.0 + rank,
                           allocated_bytes=100 << 20, reserved_bytes=120 << 20,
                           peak_allocated_bytes=(110 + rank) << 20, driver_used_bytes=300 << 20,
                           host_rss_bytes=300 << 20, rank=rank)

    for n in range(2, 9):
        rows = [RankRow(k, sample(k)) for k in range(n)]
        for r in rows:
            r.recent_ms.append(r.last.step_ms)
        rows[1].leak = "host_heap"
        lines = rank_table_lines(rows, 78, 14)  # the lower area at 80×24, no border
        assert len(lines) <= 14 and all(len(x) <= 78 for x in lines)
        text = "\n".join(lines)
        assert f"slowest: rank {n - 1}" in text and f"highest peak: rank {n - 1}" in text
        assert "LEAK suspected on rank 1" in text
        assert all(f"\n{k:>6} " in text for k in range(n))
        # the counters by their one name (probes/records/names.py), as the panes say them
        assert lines[0].split() == ["rank", "heap", "used", "heap", "held", "heap", "peak",
                                    "RSS", "step", "tok/s"], lines[0]
    cuda = [RankRow(k, StepSample.from_json({**sample(k).to_json(), "device": "cuda:0"}))
            for k in range(2)]
    head = rank_table_lines(cuda, 78, 14)[0]
    assert head.split() == ["rank", "allocated", "reserved", "peak", "NVML", "used", "step",
                            "tok/s"], head
    assert "alloc " not in head and "resv" not in head and "driver" not in head


def test_the_rank_that_raised_is_named_not_the_peer_left_waiting():
    peer = RankEnd(0, 12, 12, "failed", "RuntimeError: [gloo] Connection closed by peer", 13,
                   100, 0)
    raised = RankEnd(1, 12, 12, "failed", "ValueError: bad batch", 13, 101, 0)
    ok = RankEnd(2, 12, 12, "finished", None, None, 102, 0)
    text = failure_text([peer, raised, ok], {})
    assert text.startswith("rank 1 failed at step 13: ValueError: bad batch")
    assert "rank 0 stopped with it" in text and "rank 2" not in text
    assert failure_text([ok], {}) is None
    log = ("Root Cause (first observed failure):\n[0]:\n  time      : 2026-12-01_19:50:00\n"
           "  host      : box\n  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 7)\n"
           "  error_file: <N/A>\n  traceback : Signal 9 (SIGKILL) received by PID 7\n")
    assert process_exits(log) == {1: ProcessExit(1, -9, "Signal 9 (SIGKILL) received by PID 7")}


def test_rank_table_shows_phase_medians_and_names_the_straggler_phase():
    """Rank 1's loader is slow; under DDP rank 0 waits for it in backward (issue 26)."""
    split = {0: dict(data_wait_ms=1.0, forward_ms=2.0, backward_ms=45.0, optimizer_ms=1.0,
                     other_ms=1.0),
             1: dict(data_wait_ms=39.0, forward_ms=2.0, backward_ms=7.0, optimizer_ms=1.0,
                     other_ms=1.0)}
    rows = []
    for rank, phases in split.items():
        row = RankRow(rank)
        for step in range(1, 6):
            row.last = make_sample(step, rank=rank, step_ms=50.0 if rank == 0 else 11.0,
                                   **phases)
            row.recent.append(row.last)
            row.recent_ms.append(row.last.step_ms)
        rows.append(row)
    lines = rank_table_lines(rows, 78, 14)
    text = "\n".join(lines)
    assert len(lines) <= 14 and all(len(x) <= 78 for x in lines)
    assert " split      wait       fwd       bwd" in text and "39.0 ms" in text
    assert "straggler rank 1: +38 ms in data wait" in text
    assert "slowest: rank 0, 50.0 ms" in text and "(waiting for rank 1)" in text
