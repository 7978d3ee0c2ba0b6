"""benchmarks/gpu_check.py as a process on a machine without a GPU: its dry run lists every CUDA
claim as NOT RUN (its pure parts: tests/unit/test_gpu_check.py)."""

from __future__ import annotations

import subprocess
import sys

from factories import ROOT, import_benchmark, subprocess_env


def test_dry_run_lists_every_claim_not_run(tmp_path):
    out = tmp_path / "gc"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), str(out),
                          "--dry-run"], capture_output=True, text=True, timeout=120,
                         env=subprocess_env())
    assert res.returncode == 0, res.stderr
    text = (out / "summary.md").read_text()
    n_claims = sum(len(v) for v in import_benchmark("gpu_check").CLAIMS.values())
    assert text.count("**NOT RUN**") == n_claims >= 15
    assert "PASS" not in text and "nothing measured" in text
