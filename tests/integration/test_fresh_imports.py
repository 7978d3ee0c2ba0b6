"""What a fresh interpreter loads: the readers (memtop view, runs, report, compare) never load
torch or Textual, and probes/ pulls in no Textual (import-linter checks the source:
tests/unit/test_layers.py; these check what really gets imported, lazily offered names included).
"""

from __future__ import annotations

import json

from factories import TORCH_FREE, run_python


def test_every_reader_module_imports_without_torch_or_textual():
    """Every module of the torch-free packages, each lazily offered name included (an import
    edge import-linter cannot see), loads in a fresh interpreter without torch or Textual."""
    code = (
        "import importlib, pkgutil, sys\n"
        f"for name in {TORCH_FREE!r}:\n"
        "    pkg = importlib.import_module(name)\n"
        "    for info in pkgutil.walk_packages(pkg.__path__, name + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "    for attr in pkg.__all__:\n"
        "        getattr(pkg, attr)\n"
        "bad = [m for m in ('torch', 'textual') if m in sys.modules]\n"
        "assert not bad, bad\n")
    out = run_python(code)
    assert out.returncode == 0, out.stderr[-3000:]


def test_memtop_report_and_runs_never_import_torch(tmp_path):
    """The commands a user runs on a copied run folder, in-process in a fresh interpreter."""
    run = tmp_path / "runs" / "20260101-000000-abcdef"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"warmup_steps": 0}))
    step = {"step": 1, "time_s": 0.1, "loss": 2.0, "tokens_per_s": 100.0, "step_ms": 10.0,
            "allocated_bytes": 1, "reserved_bytes": 2, "peak_allocated_bytes": 1,
            "driver_used_bytes": 3, "host_rss_bytes": 3, "scale": None, "skipped_steps": 0,
            "amp": "off", "device": "cpu"}
    rows = [{"event": "run_started", "step": 0, "time_s": 0.0, "device": "cpu"}, step,
            {"event": "run_finished", "step": 1, "time_s": 0.2, "reason": "finished"}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = ("import sys\nfrom tui.cli import main\n"
            "assert main(['report', sys.argv[1]]) == 0\n"
            "assert main(['runs', sys.argv[2]]) == 0\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    out = run_python(code, str(run), str(run.parent))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert (run / "report.md").is_file()


def test_import_probes_pulls_in_no_textual():
    code = ("import sys, probes.monitor.monitor, probes.runfolder, probes.analysis.report.build; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'tui')); "
            "print(bad); sys.exit(1 if bad else 0)")
    done = run_python(code)
    assert done.returncode == 0, done.stdout + done.stderr
