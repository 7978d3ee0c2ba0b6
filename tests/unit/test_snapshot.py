"""`memtop snapshot` on a real CUDA memory snapshot (tests/data, recorded on a real GPU by
others): its figures checked against sums computed here from the dict itself, and a hostile
pickle refused with nothing run."""

from __future__ import annotations

import os
import pickle
from collections import Counter

import pytest
from factories import ROOT

from probes.traces.snapshot import (
    SnapshotError,
    live_by_site,
    load_snapshot,
    summarize,
    user_site,
)
from tui.cli import main
from tui.commands.snapshot import snapshot_lines

REAL = ROOT / "tests" / "data" / "transformer-history-snapshot.pickle"


def plain_load(path):
    """The snapshot read here by other means: the trusted file, no class in it."""
    with open(path, "rb") as f:
        return pickle.load(f)  # noqa: S301 - the repository's own test data


def test_figures_match_sums_of_the_dict():
    d = plain_load(REAL)
    s = summarize(load_snapshot(REAL))
    blocks = [b for seg in d["segments"] for b in seg["blocks"]]
    assert s.reserved_bytes == sum(seg["total_size"] for seg in d["segments"])
    assert s.segments == len(d["segments"])
    assert s.active_blocks == sum(b["state"] == "active_allocated" for b in blocks)
    assert s.allocated_bytes == sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    assert s.free_bytes == sum(b["size"] for b in blocks if b["state"] == "inactive")
    assert s.largest_free_bytes == max(b["size"] for b in blocks if b["state"] == "inactive")
    assert s.history_entries == sum(len(t) for t in d["device_traces"])
    assert s.actions == dict(Counter(e["action"] for t in d["device_traces"] for e in t))
    assert s.expandable_segments is d["allocator_settings"]["expandable_segments"]


def test_live_sites_are_allocs_never_freed_grouped_by_user_line():
    d = plain_load(REAL)
    trace = d["device_traces"][0]
    freed_after: dict[int, int] = {}
    for i, e in enumerate(trace):
        if e["action"] != "alloc":
            freed_after[e["addr"]] = i
    last_alloc = {e["addr"]: (i, e) for i, e in enumerate(trace) if e["action"] == "alloc"}
    alive = [e for addr, (i, e) in last_alloc.items() if freed_after.get(addr, -1) < i]
    sites = live_by_site(trace)
    assert sum(site.bytes for site in sites) == sum(e["size"] for e in alive)
    assert sum(site.blocks for site in sites) == len(alive)
    top = max(alive, key=lambda e: e["size"])
    assert sites[0].bytes == top["size"] and sites[0].where == user_site(top["frames"])
    assert not any("site-packages" in site.where for site in sites)


def test_window_keeps_only_what_was_allocated_since():
    trace = plain_load(REAL)["device_traces"][0]
    last = max(e["time_us"] for e in trace)
    assert live_by_site(trace, since_us=last + 1) == []


def test_user_site_skips_library_frames_of_another_machine():
    frames = [{"filename": "C:\\env\\Lib\\site-packages\\torch\\nn\\functional.py", "line": 9,
               "name": "linear"},
              {"filename": "C:\\Lib\\threading.py", "line": 1, "name": "run"},
              {"filename": "D:\\proj\\model.py", "line": 39, "name": "forward"}]
    assert user_site(frames) == "model.py:39 forward"
    assert user_site(frames[:2]) is None


def test_cli_prints_the_summary(capsys):
    assert main(["snapshot", str(REAL)]) == 0
    out = capsys.readouterr().out
    s = summarize(load_snapshot(REAL))
    assert out.splitlines() == snapshot_lines(s)
    assert f"in {s.segments} segments" in out and s.sites[0].where in out


class Hostile:
    def __reduce__(self):
        return (os.system, ("touch hostile-ran",))


def test_hostile_pickle_is_refused_and_nothing_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps(Hostile()))
    assert main(["snapshot", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "system" in err and "refused" in err
    assert not (tmp_path / "hostile-ran").exists()
    with pytest.raises(SnapshotError):
        load_snapshot(path)


@pytest.mark.parametrize("content", [b"not a pickle", pickle.dumps({"no": "segments"}),
                                     pickle.dumps([1, 2])])
def test_foreign_files_are_one_line_and_exit_2(tmp_path, capsys, content):
    path = tmp_path / "x.pickle"
    path.write_bytes(content)
    assert main(["snapshot", str(path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_missing_file_is_one_line(tmp_path, capsys):
    assert main(["snapshot", str(tmp_path / "none.pickle")]) == 2
    assert capsys.readouterr().err.startswith("memtop snapshot: cannot read")
