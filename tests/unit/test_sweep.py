"""`memtop sweep`: the fit on synthetic numbers, cell classification (OOM, failed), the files a
sweep writes, refusals (a real two-cell sweep interrupted with Ctrl-C:
tests/integration/test_sweep_process.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from factories import SWEEP_ARGS, write_run

from probes import records as R
from probes.analysis.sweep import (
    FAILED,
    INTERRUPTED,
    NOT_RUN,
    OK,
    OOM,
    Cell,
    cell_result,
    fit_quadratic,
    fits,
    grid,
    interrupted_row,
    not_run_row,
    parse_list,
    share_grows,
    t2_share,
    write_outputs,
)
from probes.records import Event
from probes.runfolder import json_line
from tui.cli import main


def test_fit_recovers_a_known_quadratic_and_its_t2_share():
    a, b, c = 100e6, 2e4, 30.0
    ts = [64, 128, 256, 512]
    coef = fit_quadratic(ts, [a + b * t + c * t * t for t in ts])
    assert coef == pytest.approx((a, b, c), rel=1e-6)
    shares = [t2_share(coef, t) for t in ts]
    assert shares[0] == pytest.approx(c * 64**2 / (a + b * 64 + c * 64**2))
    assert shares == sorted(shares)  # grows with T
    assert fit_quadratic([64, 128], [1.0, 2.0]) is None  # a quadratic needs three T


def test_fits_per_series_and_share_growth():
    rows = []
    for attention, c in (("explicit", 50.0), ("sdpa", 0.0)):
        for t in (64, 128, 256):
            rows.append({"attention": attention, "amp": "off", "dim": 32, "layers": 1,
                         "batch_size": 4, "seq_len": t, "status": OK,
                         "peak_allocated_bytes": 1e8 + 1e4 * t + c * t * t})
    rows.append({**rows[0], "seq_len": 512, "status": OOM, "peak_allocated_bytes": None})
    by = {f["attention"]: f for f in fits(rows)}
    assert by["explicit"]["c"] == pytest.approx(50.0) and share_grows(by["explicit"])
    assert abs(by["sdpa"]["c"]) < 1e-6 and by["explicit"]["points"] == 3


def test_parse_list_and_grid():
    assert parse_list("1, 4,8,4", "--batch-size") == [1, 4, 8]
    for bad, needle in (("", "empty list"), ("1,,2", "empty item"), ("1,x", "not an integer")):
        with pytest.raises(ValueError, match=needle):
            parse_list(bad, "--batch-size")
    cells = grid({"batch_size": [1, 2], "seq_len": [8, 16], "attention": ["explicit"],
                  "amp": ["off"], "dim": [32], "layers": [1]})
    assert [c.key for c in cells][:2] == ["b1-t8-explicit-off-d32-l1", "b1-t16-explicit-off-d32-l1"]


def _with_event(path, event, **data):
    with open(path / "metrics.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json_line(Event(event, 3, 0.5, data).to_json()) + "\n")


def test_oom_and_failed_cells_are_recorded_and_the_files_say_so(tmp_path):
    cell = Cell(4, 16, "explicit", "off", 32, 1)
    ok_root, guard_root, oom_root, bad_root, killed_root = (
        tmp_path / n for n in ("ok", "guard", "oom", "bad", "killed"))
    write_run(ok_root / "r1")
    write_run(guard_root / "r1", steps=3)
    _with_event(guard_root / "r1", R.MEMORY_GUARD, counter="host RSS", watched_bytes=10,
                limit_bytes=5)
    write_run(oom_root / "r1", steps=3)
    _with_event(oom_root / "r1", R.ERROR, error_type="OutOfMemoryError",
                message="CUDA out of memory. Tried to allocate 2.00 GiB")
    write_run(bad_root / "r1", steps=3)
    _with_event(bad_root / "r1", R.ERROR, error_type="RuntimeError", message="shape mismatch")
    killed_root.mkdir()
    rows = [cell_result(cell, ok_root, 0, 1.0), cell_result(cell, guard_root, 0, 1.0),
            cell_result(cell, oom_root, 1, 1.0), cell_result(cell, bad_root, 1, 1.0),
            cell_result(cell, killed_root, -9, 1.0), not_run_row(cell)]
    assert [r["status"] for r in rows] == [OK, OOM, OOM, FAILED, OOM, NOT_RUN]
    assert rows[0]["peak_allocated_bytes"] == 1000 and rows[0]["step_ms_p50"] is not None
    assert rows[1]["peak_allocated_bytes"] is None and "--max-memory" in rows[1]["reason"]
    assert "SIGKILL" in rows[4]["reason"]
    data = write_outputs(tmp_path, {"command": "memtop sweep"}, rows)
    assert data["not_run"] == [cell.key]
    md = (tmp_path / "sweep.md").read_text()
    assert "oom: stopped by --max-memory" in md and "Not run (1)" in md
    csv_lines = (tmp_path / "sweep.csv").read_text().splitlines()
    assert len(csv_lines) == 7 and csv_lines[0].startswith("cell,batch_size,seq_len")


@pytest.mark.parametrize("args,needle", [
    (["--batch-size", ""], "--batch-size is an empty list"),
    (["--seq-len", "8,,16"], "has an empty item"),
    (["--seq-len", "64,256", "--block-size", "128"], "--seq-len 256 is above the block size 128"),
    (["--attention", "explicit,flash"], "unknown attention 'flash'"),
    (["--steps", "0"], "--steps must be a positive integer"),
])
def test_sweep_refusals_are_one_line_before_any_cell(tmp_path, capsys, args, needle):
    out = tmp_path / "sweeps"
    assert main(["sweep", *SWEEP_ARGS, "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err
    assert not out.exists()  # nothing ran, nothing was written


def test_charts_draw_explicit_and_sdpa_on_the_same_axes(tmp_path):
    from tui.charts import sweep_charts

    rows = []
    for attention, c in (("explicit", 50.0), ("sdpa", 0.0)):
        for t in (64, 128, 256):
            rows.append({"cell": f"{attention}-{t}", "attention": attention, "amp": "off",
                         "dim": 32, "layers": 1, "batch_size": 4, "seq_len": t, "status": OK,
                         "peak_allocated_bytes": 1e8 + 1e4 * t + c * t * t,
                         "tokens_per_s_p50": 1000.0, "step_ms_p50": 5.0, "step_ms_p95": 6.0,
                         "wall_s": 1.0})
    data = write_outputs(tmp_path, {"command": "memtop sweep"}, rows)
    charts = dict(sweep_charts(data))
    peak = charts["Heap peak vs T"]  # CPU cells: the counter's one name
    assert "B=4 explicit" in peak and "B=4 sdpa" in peak and "B=4 explicit fit" in peak
    # each fitted curve its own mark (issue 44 item 12: both were dots), in the legend too
    legend = {m[2]: m[1] for m in re.finditer(r"(\S\S) B=4 (explicit fit|sdpa fit|explicit|sdpa)",
                                              peak)}
    assert legend["explicit fit"] != legend["sdpa fit"], legend
    assert len(set(legend.values())) == 4, legend
    md = (tmp_path / "sweep.md").read_text()
    assert "B=4 explicit: the c·T² share grows with T, to 3.1%" in md
    assert "B=4 sdpa: no T² term" in md


def test_eta_predicts_the_cells_left_from_their_size():
    import io

    from tui.sweep_runner import Progress

    cells = grid({"batch_size": [1, 4], "seq_len": [64, 256], "attention": ["explicit"],
                  "amp": ["off"], "dim": [32], "layers": [1]})
    progress = Progress(cells, io.StringIO(), tty=False)
    assert progress.eta_s(0) is None  # nothing to go on before the first cell
    progress.walls = [10 + 0.01 * c.batch_size * c.seq_len for c in cells[:2]]
    left = sum(10 + 0.01 * c.batch_size * c.seq_len for c in cells[2:])
    assert progress.eta_s(2) == pytest.approx(left)


def _cells(device: str | None, statuses: list[str]) -> list[dict]:
    rows = []
    for k, status in enumerate(statuses):
        cell = Cell(4, 16 * (k + 1), "explicit", "off", 32, 1)
        if status == OK:
            rows.append({"cell": cell.key, "attention": "explicit", "amp": "off", "dim": 32,
                         "layers": 1, "batch_size": 4, "seq_len": cell.seq_len, "status": OK,
                         "device": device, "peak_allocated_bytes": 1000 + k,
                         "peak_reserved_bytes": 2000, "tokens_per_s_p50": 10.0,
                         "step_ms_p50": 5.0, "step_ms_p95": 6.0, "wall_s": 1.0})
        elif status == INTERRUPTED:
            rows.append(interrupted_row(cell, Path("cells") / cell.key))
        else:
            rows.append(not_run_row(cell))
    return rows


def test_sweep_md_names_the_peaks_by_the_devices_counters(tmp_path):
    """Issue 44 item 12: "peak alloc / peak resv" on CPU, where every other file and screen says
    heap peak / heap held (probes/records/names.py)."""
    write_outputs(tmp_path, {"command": "memtop sweep", "device": "auto"}, _cells("cpu", [OK]))
    md = (tmp_path / "sweep.md").read_text()
    assert "| heap peak " in md and "| peak heap held " in md, md
    assert "## Heap peak = a + b·T + c·T²" in md
    assert not re.search(r"peak alloc|peak resv|[Pp]eak allocated|reserved:", md), md
    write_outputs(tmp_path, {"command": "memtop sweep"}, _cells("cuda:0", [OK]))
    md = (tmp_path / "sweep.md").read_text()
    head = next(line for line in md.splitlines() if line.startswith("| cell"))
    assert "| peak reserved " in head and "heap" not in head, head


def test_an_interrupted_cell_has_one_status_in_every_file(tmp_path):
    """Issue 44 item 12: the cell running at Ctrl-C was "not run" in sweep.md and "interrupted
    while running" in sweep.csv; now "interrupted" in both, and in sweep.json."""
    import csv
    import json

    data = write_outputs(tmp_path, {"command": "memtop sweep"},
                         _cells("cpu", [OK, INTERRUPTED, NOT_RUN]))
    md = (tmp_path / "sweep.md").read_text()
    stopped = data["cells"][1]["cell"]
    table = [line for line in md.splitlines() if line.startswith(f"| {stopped}")]
    assert len(table) == 1 and f"| {INTERRUPTED} " in table[0], table
    assert f"- {stopped}: interrupted: stopped while running" in md, md
    assert "Not run (1): b4-t48" in md and stopped not in md.split("Not run (1)")[1], md
    rows = list(csv.DictReader((tmp_path / "sweep.csv").read_text().splitlines()))
    assert [r["status"] for r in rows] == [OK, INTERRUPTED, NOT_RUN]
    assert "interrupted while running" not in (tmp_path / "sweep.csv").read_text()
    cells = json.loads((tmp_path / "sweep.json").read_text())["cells"]
    assert [c["status"] for c in cells] == [OK, INTERRUPTED, NOT_RUN]
    assert data["not_run"] == [rows[2]["cell"]]
