"""The layers are checked, not described (docs/ARCHITECTURE.md, "Layers"): import-linter's
contracts in pyproject.toml, and at run time that the readers never load torch or Textual."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

TORCH_FREE = ("probes.tools", "probes.records", "probes.runfolder", "probes.control",
              "probes.traces", "probes.analysis")
SUBPACKAGES = (*TORCH_FREE, "probes.counters", "probes.instruments", "probes.monitor")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_import_contracts_hold():
    """tui → trainer → probes; probes/ in its layers; torch-free readers; Textual only in tui/;
    no cycles at any depth."""
    lint = Path(sys.executable).with_name("lint-imports")
    cmd = [str(lint)] if lint.exists() else [sys.executable, "-m", "importlinter.cli"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env=_env())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


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
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=_env())
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
    out = subprocess.run([sys.executable, "-c", code, str(run), str(run.parent)],
                         capture_output=True, text=True, timeout=120, env=_env())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert (run / "report.md").is_file()


@pytest.mark.parametrize("name", SUBPACKAGES)
def test_each_subpackage_says_what_it_offers(name):
    """A usage docstring and an __all__ whose every name resolves."""
    pkg = importlib.import_module(name)
    assert pkg.__doc__ and len(pkg.__doc__.strip().splitlines()) >= 3, f"{name} has no usage doc"
    assert pkg.__all__, f"{name} has no __all__"
    missing = [attr for attr in pkg.__all__ if not hasattr(pkg, attr)]
    assert not missing, f"{name} offers names it does not have: {missing}"
    if not getattr(pkg, "__path__", None):
        return
    modules = [info.name for info in pkgutil.iter_modules(pkg.__path__)]
    assert modules, f"{name} holds no modules"
