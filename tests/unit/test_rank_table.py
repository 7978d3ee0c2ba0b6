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
        rows[-1].last = StepSample.from_json({**rows[-1].last.to_json(), "step_ms": 30.0})
        for r in rows:
            r.recent_ms.append(r.last.step_ms)
            r.recent.append(r.last)
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
    # one line: the rank the others wait for (rank 1), not rank 0 whose steps are long
    # 38 ms of the median cycle (data wait + step: 51 and 50 ms)
    assert "slowest: rank 1, +38.0 ms in data wait (75% of a step); others wait for it" in text
    assert "slowest: rank 0" not in text and "straggler rank" not in text


def _rows(split: dict[int, dict[str, float]], step_ms: dict[int, float]) -> list[RankRow]:
    rows = []
    for rank, phases in split.items():
        row = RankRow(rank)
        for step in range(1, 6):
            row.last = make_sample(step, rank=rank, step_ms=step_ms[rank], **phases)
            row.recent.append(row.last)
            row.recent_ms.append(row.last.step_ms)
        rows.append(row)
    return rows


def test_min_median_max_sit_under_the_counters_not_under_the_split_header():
    """Issue 44 item 6: below "split wait fwd bwd opt other (median)" the spread rows read as
    phase times; they belong under the counters' header, right after the ranks' rows."""
    phases = dict(data_wait_ms=1.0, forward_ms=2.0, backward_ms=5.0, optimizer_ms=1.0,
                  other_ms=1.0)
    for n, (width, height) in ((2, (98, 26)), (2, (78, 14)), (4, (78, 14))):
        lines = rank_table_lines(_rows(dict.fromkeys(range(n), phases), dict.fromkeys(
            range(n), 10.0)), width, height)
        labels = [line.split()[0] for line in lines if line.strip()]
        assert labels[0] == "rank" and labels[1:n + 1] == [str(k) for k in range(n)], labels
        assert "split" in labels, labels
        head = labels.index("split")
        spread = [i for i, label in enumerate(labels) if label in ("min", "median", "max")]
        assert spread and all(n < i < head for i in spread), labels  # above the split block
        assert labels[head + 1:head + 1 + n] == [str(k) for k in range(n)], labels


def test_one_slowest_rank_and_a_tiny_difference_is_no_straggler():
    """Issue 44 item 7: +0.1% is not a straggler; the view says the report's words."""
    from probes.analysis.ranks import NO_STRAGGLER, slowest_rank, slowest_text

    even = dict(data_wait_ms=1.0, forward_ms=100.0, backward_ms=300.0, optimizer_ms=5.0,
                other_ms=5.0)
    tiny = dict(even, forward_ms=100.4)  # +0.4 ms of a 411 ms cycle: +0.1%
    rows = _rows({0: tiny, 1: even}, {0: 410.4, 1: 410.0})
    text = "\n".join(rank_table_lines(rows, 78, 14))
    assert NO_STRAGGLER in text and "slowest: rank" not in text and "straggler rank" not in text
    assert slowest_rank({r.rank: r.recent for r in rows}) is None
    # a real one: rank 1's optimizer +60 ms; rank 0 waits in backward, so its step is longer
    slow = dict(even, optimizer_ms=65.0)
    waits = dict(even, backward_ms=360.0)
    rows = _rows({0: waits, 1: slow}, {0: 470.0, 1: 470.0})
    found = slowest_rank({r.rank: r.recent for r in rows})
    assert found is not None and (found.rank, found.phase) == (1, "optimizer_ms")
    assert slowest_text(found) in "\n".join(rank_table_lines(rows, 78, 14))
    # no step split in the rows: the step times are all there is, with the same threshold
    bare = {0: [make_sample(s, step_ms=100.0) for s in range(1, 4)],
            1: [make_sample(s, step_ms=100.1) for s in range(1, 4)]}
    assert slowest_rank(bare) is None
    bare[1] = [make_sample(s, step_ms=130.0) for s in range(1, 4)]
    found = slowest_rank(bare)
    assert found is not None and found.rank == 1 and found.phase is None
    assert slowest_text(found).startswith("slowest: rank 1, +30.0 ms per step (")


def test_the_report_names_the_slowest_rank_as_the_rank_table_does(tmp_path):
    """Issue 44 item 7: the view said "slowest: rank 0" (its long, waiting steps) while the
    report said "Slowest rank: 1"; both now say the rank the others wait for, in one line."""
    import json

    from factories import TINY

    from probes.analysis.report import write_report

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(dict(TINY, steps=8, warmup_steps=2)))
    split = {0: dict(data_wait_ms=1.0, forward_ms=2.0, backward_ms=45.0, optimizer_ms=1.0,
                     other_ms=1.0),  # rank 0 waits for rank 1 in its backward
             1: dict(data_wait_ms=39.0, forward_ms=2.0, backward_ms=7.0, optimizer_ms=1.0,
                     other_ms=1.0)}
    rows = {}
    for rank, phases in split.items():
        samples = [make_sample(s, rank=rank, step_ms=50.0 if rank == 0 else 11.0, **phases)
                   for s in range(1, 9)]
        rows[rank] = samples
        started = {"event": "run_started", "step": 0, "time_s": 0.0, "device": "cpu",
                   "amp": "bf16", "params": 10, "rank": rank}
        lines = [started, *(x.to_json() for x in samples),
                 {"event": "run_finished", "step": 8, "time_s": 1.0, "reason": "finished"}]
        (run / f"metrics-rank-{rank}.jsonl").write_text(
            "".join(json.dumps(x) + "\n" for x in lines))
    md = write_report(run).read_text()
    table = [RankRow(k, r[-1]) for k, r in rows.items()]
    for row, samples in zip(table, rows.values(), strict=True):
        row.recent.extend(samples)
        row.recent_ms.extend(s.step_ms for s in samples)
    line = next(x for x in rank_table_lines(table, 78, 14) if x.startswith("slowest"))
    assert line.startswith("slowest: rank 1, +38.0 ms in data wait")
    assert f"- S{line[1:]} (phase medians" in md, md
    assert "Slowest rank: 0" not in md and "Straggler" not in md
    report = json.loads((run / "report.json").read_text())
    assert report["ranks"]["slowest"]["rank"] == 1
