"""benchmarks/RESULTS.md is one table of figures that the benchmarks themselves keep: every case
it names is one `python -m benchmarks list` lists (with its --help saying what it measures and
its target), every GPU claim of the registry has a row, and the results writer rewrites a
figure's row in place (and logs the run by its date) when a case or a GPU run publishes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from factories import ROOT, import_benchmark, subprocess_env

results = import_benchmark("harness.results")
cases = import_benchmark("cases")
cli = import_benchmark("harness.cli")
BENCH = ROOT / "benchmarks"
RUN = re.compile(r"python -m benchmarks run ([\w-]+)")


def rows(path: Path = BENCH / "RESULTS.md") -> dict[str, list[str]]:
    return results.Table(path).rows


def test_results_is_one_table_of_figures_under_150_lines():
    lines = (BENCH / "RESULTS.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < 150
    table = [i for i, line in enumerate(lines) if line.startswith("|")]
    assert table == list(range(table[0], table[-1] + 1)), "one table, no other"
    assert lines[table[0]] == results.HEADER
    got = rows()
    assert len(got) == len(table) - 2 >= 40
    for fid, cells in got.items():
        assert len(cells) == len(results.COLUMNS), fid
        assert cells[4] in results.STATUSES, (fid, cells[4])
        assert cells[5] == "—" or re.fullmatch(r"\d{4}-\d{2}-\d{2}", cells[5]), fid
        link = re.fullmatch(r"\[(\d{4}-\d{2}-\d{2})\]\((results/\d{4}-\d{2}-\d{2}\.md)\)",
                            cells[8])
        if cells[4] != "NOT RUN":  # a measured figure names its day's log, which holds it
            assert link and link.group(1) == cells[5], fid
        if link:
            assert (BENCH / link.group(2)).is_file(), fid


def test_every_case_the_table_names_is_one_benchmarks_lists():
    listed = subprocess.run([sys.executable, "-m", "benchmarks", "list"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, env=subprocess_env())
    assert listed.returncode == 0, listed.stderr
    names = set(re.findall(r"^  (\w+) ", listed.stdout, re.M))
    assert names == {c.name for c in cases.all_cases()}
    for fid, cells in rows().items():
        if fid.startswith("gpu/"):
            continue
        named = RUN.findall(cells[7])
        assert named and fid.split("/")[0] in named, (fid, cells[7])
        assert set(named) <= names, (fid, named)


def test_each_case_says_what_it_measures_and_its_target():
    for case in cases.all_cases():
        module = case.import_module()
        assert callable(module.options) and callable(module.main), case.name
        helptext = " ".join(cli.parser_for(case, module).format_help().split())
        assert " ".join(f"Measures: {case.measures}".split()) in helptext, case.name
        assert " ".join(f"Target: {case.target}".split()) in helptext, case.name


def test_every_gpu_claim_has_a_row():
    reg = import_benchmark("gpu.registry")
    reg.load_claim_modules()
    claims = {f"gpu/{c.name}" for c in reg.ordered_claims()}
    gpu_rows = {fid for fid in rows() if fid.startswith("gpu/")}
    assert claims == gpu_rows, (sorted(claims - gpu_rows), sorted(gpu_rows - claims))


def _copy_results(tmp_path: Path) -> Path:
    home = tmp_path / "bench"
    home.mkdir()
    shutil.copyfile(BENCH / "RESULTS.md", home / "RESULTS.md")
    return home


def test_the_writer_rewrites_a_row_in_place_and_logs_the_run(tmp_path):
    home = _copy_results(tmp_path)
    before = rows(home / "RESULTS.md")
    when = time.mktime((2031, 5, 6, 12, 0, 0, 0, 0, -1))
    figs = [results.Figure("kill9_loss/age", "what a kill -9 loses", "≤ 500 ms",
                           "612 ms | max", "MISSED"),
            results.Figure("new_case/figure", "a figure no row had yet", "≥ 1", "2", "met"),
            results.Figure("step_overhead/gpt", "a run under load", "≥ 0.99", "0.5",
                           "not judged (under load: others used 1.20 cores)")]
    log, written = results.record("A title", "the body", figs, command="python -m benchmarks run x",
                         machine_line="a machine", machine_short="CPU · bf16 native · 2 cores",
                         results=home / "RESULTS.md", logs=home / "results", when=when)
    day = time.strftime("%Y-%m-%d", time.gmtime(when))
    assert log == home / "results" / f"{day}.md"
    assert written == ["kill9_loss/age", "new_case/figure"]  # a judged row keeps its figure
    text = log.read_text(encoding="utf-8")
    assert text.startswith(f"# memtop benchmark log, {day}") and "## A title (" in text
    assert "Machine: a machine" in text and "the body" in text
    after = rows(home / "RESULTS.md")
    assert list(after)[:len(before)] == list(before) and list(after)[-1] == "new_case/figure"
    assert {k: v for k, v in after.items() if k not in ("kill9_loss/age", "new_case/figure")} \
        == {k: v for k, v in before.items() if k != "kill9_loss/age"}  # step_overhead/gpt too
    row = after["kill9_loss/age"]
    assert row[3:9] == ["612 ms / max", "missed", day, "CPU · bf16 native · 2 cores",
                        "`python -m benchmarks run x`", f"[{day}](results/{day}.md)"]


@pytest.mark.slow  # a real case in a child: two kills of a child writing rows
def test_a_case_run_updates_its_row(tmp_path):
    home = _copy_results(tmp_path)
    res = subprocess.run([sys.executable, "-m", "benchmarks", "run", "kill9_loss", "--kills",
                          "2"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=subprocess_env(MEMTOP_BENCHMARK_RESULTS=str(home)))
    assert res.returncode == 0, res.stderr[-2000:]
    row = rows(home / "RESULTS.md")["kill9_loss/age"]
    day = time.strftime("%Y-%m-%d", time.gmtime())
    assert row[5] == day and row[7] == "`python -m benchmarks run kill9_loss --kills 2`"
    assert row[4] in ("met", "missed") and re.match(r"\d+ ms \(median \d+", row[3])
    log = (home / "results" / f"{day}.md").read_text(encoding="utf-8")
    assert "## What a kill -9 loses (issue 28)" in log and "2 kills at random moments" in log
    assert (BENCH / "RESULTS.md").read_text() != (home / "RESULTS.md").read_text()


def test_record_gpu_writes_the_claims_rows(tmp_path):
    """Stand-in summary (written here, not from a GPU): PASS is met, FAIL missed, a NOT RUN
    keeps a row that holds a measured status; a CPU run is refused."""
    home = _copy_results(tmp_path)
    record = import_benchmark("gpu.record")

    def claim(name, status, detail):
        return {"name": name, "group": "g", "text": f"{name} holds", "status": status,
                "detail": detail, "seconds": 1.0}

    summary = {"device": "cuda", "device_name": "A GPU", "torch": "t", "torch_cuda": "c",
               "started": time.time(), "claims": [
                   claim("sample_cost", "PASS", "12 µs"), claim("own_loop_on_cuda", "FAIL",
                                                                "exit 1"),
                   claim("nvml_minus_reserved_gap", "NOT RUN", "time budget")]}
    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps(summary))
    args = [str(path), "--results", str(home / "RESULTS.md"), "--logs", str(home / "results")]
    before = rows(home / "RESULTS.md")
    assert record.main(args) == 0
    after = rows(home / "RESULTS.md")
    assert after["gpu/sample_cost"][3:5] == ["12 µs", "met"]
    assert after["gpu/own_loop_on_cuda"][3:5] == ["exit 1", "missed"]
    assert after["gpu/own_loop_on_cuda"][7] == \
        "`GPU_RUN_ONLY=own_loop_on_cuda bash benchmarks/gpu/run.sh`"
    assert after["gpu/nvml_minus_reserved_gap"] == before["gpu/nvml_minus_reserved_gap"]
    summary["device"] = "cpu"
    path.write_text(json.dumps(summary))
    assert record.main(args) == 2


FLAT = '''
"""A benchmark written the old way: a flat script beside common.py, run as a file."""
from common import ROOT, append_results, interleaved_pairs, median, ratio_row, wait_quiet
from harness.runs import tail_has
from terminal import SMOKE_ARGS, TINY, TmuxPane

import benchmarks.terminal

assert benchmarks.terminal.SMOKE_ARGS is SMOKE_ARGS and callable(TmuxPane) and TINY
assert (ROOT / "benchmarks" / "common.py").is_file() and callable(wait_quiet)
res = interleaved_pairs("a", {"a": lambda: 1.0, "b": lambda: 0.5}, 2)
row, verdict = ratio_row("b / a", res["ratios"]["b"], res["aa"], 0.99, 0.0, 0.3)
append_results("A flat script", f"{row}\\n\\nmedian {median(res['ratios']['b'])}")
print(verdict, tail_has(ROOT / "benchmarks" / "common.py", "append_results"))
'''


def test_a_flat_script_on_the_old_import_paths_still_runs(tmp_path):
    """A script written against benchmarks/common.py, harness/runs.py and terminal.py (run as
    ``python benchmarks/X.py``, benchmarks/ first on its path) imports and logs its section."""
    home = _copy_results(tmp_path)
    script = tmp_path / "flat_case.py"
    script.write_text(FLAT, encoding="utf-8")
    env = subprocess_env(MEMTOP_BENCHMARK_RESULTS=str(home))
    env["PYTHONPATH"] = str(BENCH)  # what running a file of benchmarks/ puts first
    res = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "not judged (2 pairs < 7) True"
    (log,) = (home / "results").glob("*.md")
    assert "## A flat script (" in log.read_text() and "| b / a | 2 |" in log.read_text()
