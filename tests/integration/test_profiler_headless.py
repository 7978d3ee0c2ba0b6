"""`memtop train --headless --profile-at`: the window's files from a real process, no profiler
chatter on its output, and the analysis worker run again on its own, without torch (the window
inside a trainer of this process: tests/unit/test_profiler.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from factories import ROOT, run_cli

from probes.runfolder import read_metrics


@pytest.mark.slow
def test_headless_profile_at_writes_files_and_stays_quiet(tmp_path):
    runs = tmp_path / "runs"
    # a window at 3 (done by 8 or 9), and one at 8 that cannot finish before the run ends at 9
    proc = run_cli("train", "--headless", "--profile-at", "3", "--profile-at", "8", "--steps", "9",
                   "--layers", "1",
                   "--dim", "32", "--heads", "2", "--seq-len", "16", "--batch-size", "4",
                   "--run-dir", str(runs), "--log-every", "100")
    assert proc.returncode == 0, proc.stderr
    assert "== profile_done at step" in proc.stdout
    for noise in ("USDT", "External init callback", "profiler_start"):
        assert noise not in proc.stdout and noise not in proc.stderr
    (run_dir,) = list(runs.iterdir())
    folder = run_dir / "profiles" / "step-3"
    assert {"trace.json", "top_ops.txt", "top_ops.json", "window.json"} <= {
        p.name for p in folder.iterdir()}
    assert "traceEvents" in json.loads((folder / "trace.json").read_text())
    info = json.loads((folder / "window.json").read_text())
    assert info["record_shapes"] is False and info["trigger"] == "profile_at"
    _, events, bad = read_metrics(run_dir / "metrics.jsonl")
    assert bad == 0
    (done,) = [e for e in events if e["event"] == "profile_done"]
    assert done["dir"] == "profiles/step-3" and done["top_ops"][0]["calls"] > 0
    names = [e["event"] for e in events]
    assert names.index("profile_done") < names.index("run_finished")
    if "profile_cancelled" in names:  # the window at 8 opened once the first was analysed
        ending = [n for n in names if n != "weights_saved"]  # saved at the end, either side
        assert ending[-2:] == ["profile_cancelled", "run_finished"]
        assert not (run_dir / "profiles" / "step-8").exists()
    assert names.count("profile_started") == names.count("profile_cancelled") + 1

    # the analysis worker needs no torch: run it again with no flags, and check that it finds
    # the same table (on a CUDA machine the run used the GPU: the device columns and the device
    # sort come from the trace itself) (isolated: -I ignores PYTHONPATH, so the checkout comes
    # in as an argument)
    check = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
             "from probes.traces.opstable import main; main(sys.argv[1:]); "
             "assert 'torch' not in sys.modules, 'torch imported'")
    out = tmp_path / "again"
    out.mkdir()
    subprocess.run([sys.executable, "-I", "-c", check, str(ROOT), str(folder / "trace.json"),
                    str(out)], check=True, timeout=60)
    again = json.loads((out / "top_ops.json").read_text())["top_ops"]
    assert again == done["top_ops"]
