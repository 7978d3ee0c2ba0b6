"""`memtop fit` as a process: bad input is one line and exit 2 before anything runs; a whole
probe prints its answer and writes fit.json and the report's section; Ctrl-C mid-probe leaves a
valid partial fit.json (exit 130); --verify runs its sizes in fresh processes."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest
from factories import read_jsonl, run_cli, start_cli, wait_until

from probes.analysis.fit import INTERRUPTED, NOT_RUN, OK
from probes.analysis.fit_file import read_fit
from probes.control.unix_socket import request

TINY_FIT = ("--device", "cpu", "--amp", "off", "--layers", "1", "--heads", "2", "--dim", "32",
            "--batch-size", "4", "--seq-len", "32", "--block-size", "64")


@pytest.mark.parametrize("args, says", [
    (("--memory", "1KiB"), "below the model's own size"),
    (("--memory", "100MiB"), "(RSS"),  # train's --max-memory rule: RSS with torch loaded
    (("--seq-len", "512", "--block-size", "256"), "--seq-len 512 is above the block size 256"),
    (("--headroom", "100"), "not a percentage from 0 up to 100"),
    (("--vary", "context", "--seq-len", "2", "--block-size", "8"), "--seq-len of at least 4"),
    (("--vary", "sideways"), "invalid choice: 'sideways'"),
    (("--memory", "lots"), "cannot read 'lots' as a size"),
    (("--batch-size", "0"), "--batch-size must be a positive integer"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, says):
    done = run_cli("fit", "--device", "cpu", "--run-dir", str(tmp_path / "runs"), *args,
                   timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memtop fit: ") and says in lines[0]
    assert "Traceback" not in done.stderr and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_whole_probe_prints_the_answer_and_writes_fit_json(tmp_path):
    done = run_cli("fit", *TINY_FIT, "--memory", "2GiB", "--run-dir", str(tmp_path / "runs"),
                   timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for text in ("largest B at T=32:", "largest T at B=4:", "residual", "predicted peak",
                 "moves the limit most", "budget 2.0 GiB (--memory), headroom 10%"):
        assert text in out, out
    screen = [line for line in out.splitlines() if not line.startswith("memtop: ")]
    assert all(len(line) <= 80 for line in screen), screen  # paths aside: one 80-column screen
    run = next((tmp_path / "runs").iterdir())
    doc = read_fit(run)
    assert doc["state"] == "finished" and doc["fit"] is not None
    assert all(p["status"] == OK for p in doc["points"])
    ans = doc["answer"]
    assert ans["batch"]["largest"] >= 1 and ans["context"]["largest"] == 64  # the context
    assert ans["context"]["capped_by_context"]
    report = (run / "report.md").read_text()
    assert "## Will it fit?" in report and "largest B at T=32" in report
    points = [e for e in read_jsonl(run / "metrics.jsonl") if e.get("event") == "fit_point"]
    fresh = [p for p in doc["points"] if p.get("role") == "fresh"]  # its own process's folder
    assert len(points) == len(doc["points"]) - 1 and len(fresh) == 1
    b, t = fresh[0]["batch_size"], fresh[0]["seq_len"]
    assert (run / "fresh" / f"b{b}-t{t}" / "metrics.jsonl").is_file()
    assert doc["fit"]["run_to_run"] is not None and "run to run: a fresh process" in out


@pytest.mark.slow
def test_ctrl_c_mid_probe_leaves_a_valid_partial_fit_json(tmp_path):
    """The probe is paused through its socket after its first point (so the signal lands
    mid-probe on any machine), then Ctrl-C: exit 130, fit.json says interrupted and keeps the
    measured point, the one in flight interrupted, the rest not run."""
    runs = tmp_path / "runs"
    proc = start_cli("fit", *TINY_FIT, "--memory", "2GiB", "--run-dir", str(runs),
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def first_point():
            assert proc.poll() is None, proc.stdout.read()
            found = list(runs.glob("*/fit.json"))
            return found[0].parent if found and read_fit(found[0].parent)["points"] else None

        run = wait_until(first_point, "the first probe point in fit.json", timeout_s=180,
                         poll_s=0.05)
        answer = request(run / "control.sock", {"request": "pause", "source": "test"})
        assert answer.get("ok", True), answer
        wait_until(lambda: any(e.get("event") == "paused"
                               for e in read_jsonl(run / "metrics.jsonl")),
                   "the probe to pause", timeout_s=60)
        proc.send_signal(signal.SIGINT)
        text, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, text
    doc = json.loads((run / "fit.json").read_text())
    assert doc["state"] == "interrupted"
    statuses = [p["status"] for p in doc["points"]]
    assert statuses[0] == OK and INTERRUPTED in statuses
    assert set(statuses[statuses.index(INTERRUPTED) + 1:]) <= {NOT_RUN}
    assert len(doc["points"]) == len(doc["planned_points"])
    assert "interrupted" in text


@pytest.mark.slow
def test_verify_runs_the_largest_size_under_the_budget_and_the_next_over_it(tmp_path):
    """A budget a little above what the probe holds: the largest B runs under it in a fresh
    process; the first B predicted over it is stopped by the memory guard or measured over."""
    from probes.counters.host import RssReader

    probe = run_cli("fit", *TINY_FIT, "--vary", "batch", "--memory", "4GiB", "--run-dir",
                    str(tmp_path / "probe"), timeout=240)
    assert probe.returncode == 0, probe.stderr
    doc = read_fit(next((tmp_path / "probe").iterdir()))
    rest = sum(p["bytes"] for p in doc["fit"]["parts"] if "bytes" in p)
    RssReader().close()
    budget = int(rest + 48 * 1024 * 1024)  # ~48 MiB for the steps: a B in the hundreds
    done = run_cli("fit", *TINY_FIT, "--vary", "batch", "--memory", str(budget), "--verify",
                   "--run-dir", str(tmp_path / "runs"), timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = read_fit(next((tmp_path / "runs").iterdir()))
    rows = {r["what"]: r for r in doc["verification"]}
    largest, over = rows["largest B"], rows["first B over"]
    assert largest["status"] == OK and largest["measured_bytes"] <= budget, largest
    assert abs(largest["error"]) < 0.10  # issue 41: --verify measures them within 10%
    # under the budget: "agrees" where within the band the answer stated, else said so
    assert largest["verdict"] == ("agrees" if abs(largest["error"]) <= largest["band"]
                                  else "outside the band"), largest
    assert over["agrees"], over
    assert "verify" in done.stdout and largest["verdict"].split()[0] in done.stdout


@pytest.mark.slow
def test_the_live_line_of_a_run_agrees_with_memtop_fit_within_its_band(tmp_path):
    """A `memtop train` run's ledger and steady rows give the live line (one size: B = 32);
    `memtop fit` on the same model and budget probes several: the fit's largest B lies in
    the live line's range (its band and the fit's). The budget is the live line's input: the
    test sets it where B ≈ 1.5 × the run's (the same arithmetic a --max-memory run uses)."""
    from probes.analysis.fit_live import live_fit, steady_peaks
    from probes.runfolder import read_rows

    model = ("--device", "cpu", "--amp", "off", "--layers", "2", "--heads", "2", "--dim", "64",
             "--seq-len", "64", "--block-size", "64", "--batch-size", "32")
    train = run_cli("train", "--headless", *model, "--steps", "30", "--warmup-steps", "3",
                    "--no-save-weights", "--run-dir", str(tmp_path / "train"), timeout=300)
    assert train.returncode == 0, train.stdout + train.stderr
    rows = read_rows(next((tmp_path / "train").iterdir()) / "metrics.jsonl")
    ledger = [e for e in rows.events if e["event"] == "ledger"][-1]
    peaks = steady_peaks(ledger, rows.steps)
    first = live_fit(ledger, peaks)
    budget = int(first["base_bytes"] + 3 * first["step_bytes"])
    live = live_fit(dict(ledger, budget_bytes=budget), peaks)
    done = run_cli("fit", *model, "--memory", str(budget), "--run-dir", str(tmp_path / "fit"),
                   timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = read_fit(next((tmp_path / "fit").iterdir()))
    best = doc["answer"]["batch"]
    band = live["band"] + best["band"]
    limit = budget * (1 - live["headroom_pct"] / 100)

    def at(room: float) -> float:
        return 32 * (room - live["base_bytes"]) / live["step_bytes"]

    assert at(limit / (1 + band)) - 1 <= best["largest"] <= at(limit / (1 - band)), (
        live, best, band)


@pytest.mark.slow
def test_ctrl_c_during_verify_checks_nothing_and_keeps_the_childs_exit_status(tmp_path):
    """Ctrl-C while a verification run is starting: that run is "not checked: interrupted"
    (agrees null, neither agree nor disagree), its exit status the child's own (130), and
    `memtop fit` exits 130."""
    runs = tmp_path / "runs"
    proc = start_cli("fit", *TINY_FIT, "--vary", "batch", "--memory", "4GiB", "--verify",
                     "--run-dir", str(runs), stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True)
    try:
        def child_started():
            assert proc.poll() is None, proc.stdout.read()
            return next(iter(runs.glob("*/verify/*.log")), None)

        wait_until(child_started, "the first verification run", timeout_s=240, poll_s=0.02)
        proc.send_signal(signal.SIGINT)
        text, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, text
    doc = read_fit(next(runs.iterdir()))
    assert doc["state"] == "interrupted" and doc["answer"] is not None
    row = doc["verification"][0]
    assert row["agrees"] is None and row["status"] == INTERRUPTED, row
    assert row["exit_code"] == 130, row
    assert "not checked: interrupted" in text and "DISAGREES" not in text
