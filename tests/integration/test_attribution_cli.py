"""`memtop train --headless --attribute-at STEP` in a real process: the window's event, the
table printed under its line, the report's section, and one line and exit 2 for a step the run
cannot reach."""

from __future__ import annotations

import pytest
from factories import TINY_ARGS, events_named, run_cli

from probes import records as R


@pytest.mark.slow
def test_headless_attribute_at_writes_the_event_prints_the_table_and_refuses_bad_steps(
        tmp_path):
    proc = run_cli("train", "--headless", *TINY_ARGS, "--attribute-at", "30", "--steps", "33",
                   "--run-dir", str(tmp_path), "--log-every", "100", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "== attribution_started at step 30" in proc.stdout
    assert "== memory_attribution at step 31" in proc.stdout
    assert "  module " in proc.stdout and "  ledger: params =" in proc.stdout
    run = next(p for p in tmp_path.iterdir() if p.is_dir())
    event = events_named(run, R.MEMORY_ATTRIBUTION)[0]
    assert event["steps"] == [31] and event["trigger"] == "attribute_at"
    assert event["modules"] and event["activations_total_bytes"] > 0
    assert "## Which module holds the memory" in (run / "report.md").read_text()
    for bad in (["--attribute-at", "0"], ["--attribute-at", "40", "--steps", "40"],
                ["--attribute-steps", "0"]):
        refused = run_cli("train", "--headless", *TINY_ARGS, *bad, "--run-dir", str(tmp_path))
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert "Traceback" not in refused.stderr
