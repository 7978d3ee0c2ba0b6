"""The layers are checked, not described (docs/ARCHITECTURE.md, "Layers"): import-linter's
contracts in pyproject.toml, and each subpackage's usage doc and __all__. That the readers never
load torch or Textual at run time, each in a fresh interpreter:
tests/integration/test_fresh_imports.py."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
from factories import ROOT, TORCH_FREE

SUBPACKAGES = (*TORCH_FREE, "probes.counters", "probes.instruments", "probes.monitor",
               "probes.integrations", "benchmarks.harness", "benchmarks.cases")


def test_import_contracts_hold(capsys, monkeypatch):
    """tui → trainer → probes; probes/ in its layers; torch-free readers; Textual only in tui/;
    benchmarks/ above all three and in its own layers; no cycles at any depth (import-linter, as
    `lint-imports` runs, reading the source only)."""
    from importlinter.cli import lint_imports

    monkeypatch.chdir(ROOT)  # it reads pyproject.toml (and keeps its cache) where it runs
    code = lint_imports()
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "0 broken" in out


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
