"""Several ranks: `memtop train --nproc 2` on CPU (gloo) through torch.distributed.run.

Each launch is a real torchrun with two real ranks; the tests wait on the files the ranks write
(with a deadline), never on the clock.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest
from factories import (
    TINY,
    cli_options,
    read_jsonl,
    read_jsonl_so_far,
    run_cli,
    start_cli,
    wait_for,
    wait_until,
)

from probes.runfolder import read_metrics

TINY_ARGS = tuple(cli_options(dict(TINY, block_size=16, batch_size=2)))  # two ranks: B=2 each
DEADLINE_S = 120.0


def _run_folder(root: Path) -> Path | None:
    runs = [p for p in root.glob("*") if p.is_dir()] if root.exists() else []
    return runs[0] if runs else None


def _steps(run: Path, rank: int) -> list[dict]:
    """A live rank's step rows so far."""
    return [r for r in read_jsonl_so_far(run / f"metrics-rank-{rank}.jsonl") if "event" not in r]


def _events(run: Path, rank: int, name: str) -> list[dict]:
    """A rank's events of one kind so far (its file may be mid-append)."""
    rows = read_jsonl_so_far(run / f"metrics-rank-{rank}.jsonl")
    return [r for r in rows if r.get("event") == name]


def _pids(run: Path) -> list[int]:
    return [_events(run, k, "run_started")[0]["pid"] for k in (0, 1)]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as fh:  # a zombie waits for its parent only
        return fh.read().split(") ")[1].startswith("Z")


def _launch(tmp_path: Path) -> subprocess.Popen:
    return start_cli("train", "--headless", "--nproc", "2", "--steps", "0", "--log-every",
                     "1000", "--run-dir", str(tmp_path / "runs"), *TINY_ARGS,
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def finished_ranks_run(tmp_path_factory):
    """`memtop train --headless --nproc 2 --steps 40` once for the tests that read it."""
    root = tmp_path_factory.mktemp("ranks") / "runs"
    res = run_cli("train", "--headless", "--nproc", "2", "--steps", "40", "--run-dir",
                  str(root), *TINY_ARGS, timeout=DEADLINE_S)
    return res, _run_folder(root)


@pytest.mark.slow  # torchrun and two ranks that import torch
@pytest.mark.xdist_group("finished_ranks_run")  # one worker builds the run
def test_two_ranks_write_their_own_rows_and_one_report(finished_ranks_run):
    res, run = finished_ranks_run
    assert res.returncode == 0, res.stdout + res.stderr
    names = sorted(p.name for p in run.iterdir())
    assert "metrics.jsonl" not in names and names.count("config.json") == 1
    for rank in (0, 1):
        rows = read_jsonl(run / f"metrics-rank-{rank}.jsonl")
        steps = [r for r in rows if "event" not in r]
        assert [r["step"] for r in steps] == list(range(1, 41))
        assert {r["rank"] for r in steps} == {rank}
        assert _events(run, rank, "run_finished")[0]["reason"] == "finished"
        assert f"[rank {rank}] step     40" in res.stdout
    report = json.loads((run / "report.json").read_text())
    assert [r["rank"] for r in report["ranks"]["per_rank"]] == [0, 1]
    assert report["ranks"]["global_batch"] == {**report["ranks"]["global_batch"],
                                               "ranks": 2, "sequences": 4, "tokens": 64}
    assert "## Ranks" in (run / "report.md").read_text()
    listed = run_cli("runs", str(run.parent))
    assert "cpu x2" in listed.stdout and "finished" in listed.stdout


@pytest.mark.slow  # torchrun and two ranks, then `memtop infer`
@pytest.mark.xdist_group("finished_ranks_run")  # one worker builds the run
def test_a_two_rank_run_leaves_one_weights_file_that_infer_loads(finished_ranks_run):
    from trainer.checkpoint import read_weights

    _, run = finished_ranks_run
    assert [p.name for p in run.glob("*.pt")] == ["weights.pt"]
    saved = {k: _events(run, k, "weights_saved") for k in (0, 1)}
    assert saved[1] == [] and len(saved[0]) == 1  # rank 0 saves once; DDP's ranks agree
    assert saved[0][0]["path"] == "weights.pt" and "error" not in saved[0][0]
    header, state = read_weights(run / "weights.pt")  # the model, not the DDP wrapper
    assert header["step"] == 40 and not any(k.startswith("module.") for k in state)
    res = run_cli("infer", "--headless", "--device", "cpu", "--weights", str(run),
                  "--batch-size", "1", "--prompt-len", "4", "--new-tokens", "3",
                  "--requests", "1", "--baseline-tokens", "0", "--profile-phase", "none",
                  "--run-dir", str(run.parent / "infer"), timeout=DEADLINE_S)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "warning" not in res.stderr  # the trained weights, not a fresh model


@pytest.mark.slow  # torchrun and two ranks that import torch
@pytest.mark.xdist_group("finished_ranks_run")  # one worker builds the run
async def test_dashboard_shows_both_ranks_side_by_side_at_80x24(finished_ranks_run):
    from tui.app import MemtopApp

    _, run = finished_ranks_run
    app = MemtopApp.for_folder(run)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: "slowest: rank" in app.rank_table.text
                       or "no straggler" in app.rank_table.text, "the rank table")
        lines = app.rank_table.text.splitlines()
        assert [ln.split()[0] for ln in lines[1:3]] == ["0", "1"]
        assert app.rank_table.region.height >= len(lines)  # all of it on screen
        assert app.last_sample.rank == 0 and app.last_sample.step == 40  # panes: rank 0
        await pilot.press("q")


@pytest.mark.slow  # torchrun and two ranks that import torch
def test_profile_window_on_both_ranks_at_one_step_then_sigint_stops_all(tmp_path):
    from tui.sources import FolderSource

    proc = _launch(tmp_path)
    try:
        wait_until(lambda: _run_folder(tmp_path / "runs") is not None, "the run folder")
        run = _run_folder(tmp_path / "runs")
        wait_until(lambda: all(len(_steps(run, k)) >= 3 for k in (0, 1)), "three steps per rank")
        source = FolderSource(run)
        source.start()
        source.poll()
        assert source.request("profile") is None
        wait_until(lambda: all(_events(run, k, "profile_done") for k in (0, 1)),
              "the profiler window on both ranks")
        started = [_events(run, k, "profile_started")[0]["step"] for k in (0, 1)]
        assert started[0] == started[1]
        for rank in (0, 1):
            folder = run / "profiles" / f"step-{started[0]}" / f"rank-{rank}"
            assert (folder / "trace.json").stat().st_size > 0
        pids = _pids(run)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, out
    ends = [_events(run, k, "run_finished")[0] for k in (0, 1)]
    assert [e["reason"] for e in ends] == ["interrupted (SIGINT)"] * 2
    assert ends[0]["step"] == ends[1]["step"]  # stopped before the same step
    assert (run / "report.md").exists()
    wait_until(lambda: all(_gone(p) for p in pids), "the ranks to be gone", timeout_s=10)


@pytest.mark.slow  # torchrun and two ranks that import torch
def test_a_killed_rank_ends_the_run_and_is_named(tmp_path):
    from probes.analysis.ranks import read_process_exits

    proc = _launch(tmp_path)
    try:
        wait_until(lambda: _run_folder(tmp_path / "runs") is not None, "the run folder")
        run = _run_folder(tmp_path / "runs")
        wait_until(lambda: all(len(_steps(run, k)) >= 3 for k in (0, 1)), "three steps per rank")
        pids = _pids(run)
        os.kill(pids[1], signal.SIGKILL)
        out, _ = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out
    assert "rank 1 ended without finishing" in out and "SIGKILL" in out, out
    assert read_process_exits(run)[1].exitcode == -signal.SIGKILL
    rank0 = read_jsonl(run / "metrics-rank-0.jsonl")  # every line whole JSON
    assert rank0[-1] == {**rank0[-1], "event": "run_finished", "reason": "failed"}
    killed_steps, _, torn = read_metrics(run / "metrics-rank-1.jsonl")  # may end mid-line
    assert killed_steps and torn <= 1
    report = json.loads((run / "report.json").read_text())
    assert report["ranks"]["failure"].startswith("rank 1 ended without finishing")
    assert not report["complete"]
    listed = run_cli("runs", str(tmp_path / "runs"))
    assert "failed" in listed.stdout and "rank 1" in listed.stdout
    wait_until(lambda: all(_gone(p) for p in pids), "the ranks to be gone", timeout_s=10)


@pytest.mark.parametrize("args, words", [
    (("--nproc", "0"), "--nproc must be a positive integer"),
    (("--nproc", "2", "--device", "cuda:1"), "names one GPU"),
])
def test_bad_rank_counts_are_one_line_and_exit_2(tmp_path, args, words):
    res = run_cli("train", "--headless", "--run-dir", str(tmp_path / "runs"), *args)
    assert res.returncode == 2 and words in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_a_port_in_use_is_refused(tmp_path):
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        res = run_cli("train", "--headless", "--nproc", "2", "--port", str(port), "--device",
                      "cpu", "--run-dir", str(tmp_path / "runs"))
    assert res.returncode == 2 and f"port {port} is already in use" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # torchrun and two ranks that import torch
async def test_each_ranks_window_is_its_own_and_top_ops_say_whose(tmp_path):
    """issue 30: rank 1's profiler events were written without its rank, so headless printed
    them as `[rank 0]` and the dashboard showed rank 1's window beside rank 0's panes."""
    from tui.app import MemtopApp

    res = run_cli("train", "--headless", "--nproc", "2", "--steps", "16", "--profile-at", "4",
                  "--run-dir", str(tmp_path / "runs"), *TINY_ARGS, timeout=DEADLINE_S)
    assert res.returncode == 0, res.stdout + res.stderr
    run = _run_folder(tmp_path / "runs")
    for rank in (0, 1):
        events = [r for r in read_jsonl(run / f"metrics-rank-{rank}.jsonl") if "event" in r]
        assert {e.get("rank", 0) for e in events} == {rank}, rank
        done = _events(run, rank, "profile_done")
        assert len(done) == 1 and done[0]["dir"].endswith(f"rank-{rank}")
        assert f"[rank {rank}] == profile_done at step" in res.stdout
    assert "[rank 0] == profile_started at step 4  wait 1 / warmup 1 / active 3 into " \
        "profiles/step-4/rank-1" not in res.stdout
    ranks_md = (run / "report.md").read_text().split("## Ranks")[1]
    assert "| heap peak " in ranks_md and "| peak RSS " in ranks_md  # item 5: one name each
    for size in ((80, 24), (120, 40)):
        app = MemtopApp.for_folder(run, refresh_s=0.1, freeze_gc=False)
        async with app.run_test(size=size) as pilot:
            table = app.ops_table
            await wait_for(pilot, lambda t=table: bool(t.ops), "the top-ops table")
            assert table.window["dir"].endswith("rank-0")  # the panes' rank
            assert "rank 0" in str(table.border_title), table.border_title
            await pilot.press("q")
