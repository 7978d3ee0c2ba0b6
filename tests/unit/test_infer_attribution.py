"""`memtop infer`'s memory window (issue 40: "the same window in memtop infer"): per module the KV
cache it keeps and its forward peaks in a prefill and a decode step, checked against the run's
own measured cache, its parameters and its run_started; the key's request, cancellation, the
refusals, the rows' bounds and the table's text (tests/unit/test_infer_app.py: on screen)."""

from __future__ import annotations

import pytest
from factories import run_infer

from probes import records as R
from probes.analysis.report import write_report
from probes.control.requests import Request, RunControl
from probes.records.disturbed import AFTER_ATTRIBUTION, ATTRIBUTED
from probes.records.infer_attribution import at_level, blocks_level, groups, largest
from tui.format_infer_attribution import SORT_KEYS, next_sort_key, table_lines, table_title


def _window(events):
    found = [e for e in events if e["event"] == R.INFER_ATTRIBUTION]
    assert len(found) == 1, [e["event"] for e in events]
    return found[0]


def test_window_measures_the_request_s_prefill_and_first_decode(tmp_path):
    code, run_dir, steps, events = run_infer(
        tmp_path, layers=2, requests=3, attribute_request=3, baseline_tokens=0)
    assert code == 0
    w = _window(events)
    started = next(e for e in events if e["event"] == R.RUN_STARTED)
    by_step = {s["step"]: s for s in steps}
    prefill = by_step[w["prefill_step"]]
    decode = by_step[w["decode_step"]]
    assert (prefill["phase"], decode["phase"]) == ("prefill", "decode")
    assert prefill["request"] == decode["request"] == w["request"] == 3
    assert w["steps"] == [w["prefill_step"], w["decode_step"]] == [w["step"] - 1, w["step"]]
    rows = {r["module"]: r for r in w["modules"]}
    # the cache per module is the run's measured cache, split over the layers' attention
    holders = {n: r["kv_cache_bytes"] for n, r in rows.items() if r["kv_cache_bytes"]}
    assert set(holders) == {"transformer.h.0.attn", "transformer.h.1.attn"}
    assert sum(holders.values()) == w["kv_cache_total_bytes"] == decode["kv_cache_bytes"]
    assert len(set(holders.values())) == 1
    assert w["context_tokens"] == decode["context_tokens"]
    # parameters exact: the tied embedding once, as run_started's weights_bytes counts it
    assert w["params_total_bytes"] == started["weights_bytes"]
    # the model's forward keeps the prefill's cache: its rise covers at least that
    assert w["prefill_step_peak_bytes"] >= prefill["kv_cache_bytes"]
    assert rows[""]["prefill_peak_bytes"] == w["prefill_step_peak_bytes"]
    called = [r for r in w["modules"] if r["calls"]]  # a ModuleDict is never called itself
    assert len(called) >= 16 and all(isinstance(r["decode_peak_bytes"], int) for r in called)
    per_token = started["kv_bytes_per_token"]  # the formula's, in the run's resolved dtype
    assert w["kv_cache_total_bytes"] == per_token * w["batch_size"] * w["context_tokens"]
    assert any("per token per sequence" in h for h in w["hints"])
    # its two steps and the next are disturbed; the request's other decode steps are not
    assert prefill["disturbed"] == decode["disturbed"] == ATTRIBUTED
    assert by_step[w["decode_step"] + 1]["disturbed"] == AFTER_ATTRIBUTION
    rest = [s for s in steps if s["request"] == 3 and s["step"] > w["decode_step"] + 1]
    assert rest and all(s["disturbed"] is None for s in rest)
    done = next(e for e in events if e["event"] == R.REQUEST_DONE and e["request"] == 3)
    assert done["decode_ms_p50"] is not None
    text = write_report(run_dir).read_text()
    assert "## Which module holds the memory" in text and "transformer.h.*.attn" in text


def test_the_key_waits_for_a_request_free_of_the_warm_up_and_the_profiler(tmp_path):
    control = RunControl()
    control.submit(Request("attribute", source="keyboard"))  # taken before request 1
    code, _, steps, events = run_infer(tmp_path, control=control, requests=3,
                                       profile_phase="both", baseline_tokens=0)
    assert code == 0
    w = _window(events)
    assert w["request"] == 3 and w["trigger"] == "key"  # 1 warms up, 2 is profiled
    assert not any(s["profiling"] for s in steps if s["request"] == 3)


def test_a_window_that_cannot_run_or_is_cancelled_says_why(tmp_path):
    control = RunControl()
    control.submit(Request("attribute", source="keyboard"))
    code, _, _, events = run_infer(tmp_path / "a", control=control, requests=2,
                                   profile_phase="both", baseline_tokens=0)
    assert code == 0
    kinds = [e["event"] for e in events]
    assert R.INFER_ATTRIBUTION not in kinds and R.ATTRIBUTION_STARTED not in kinds
    cancel = next(e for e in events if e["event"] == R.ATTRIBUTION_CANCELLED)
    assert "ended before request 2" in cancel["reason"]
    control = RunControl()
    control.submit(Request("attribute", source="keyboard"))
    control.submit(Request("attribute_cancel", source="keyboard"))
    code, _, _, events = run_infer(tmp_path / "b", control=control, requests=3,
                                   baseline_tokens=0)
    kinds = [e["event"] for e in events]
    assert code == 0 and R.INFER_ATTRIBUTION not in kinds
    assert [e["reason"] for e in events if e["event"] == R.ATTRIBUTION_CANCELLED] == \
        ["cancelled by the a key"]


def test_one_token_requests_measure_the_prefill_alone(tmp_path):
    code, _, _, events = run_infer(tmp_path, requests=2, new_tokens=1, attribute_request=2,
                                   baseline_tokens=0)
    assert code == 0
    w = _window(events)
    assert "decode_step" not in w and w["steps"] == [w["prefill_step"]]
    assert all(r["decode_peak_bytes"] is None for r in w["modules"])
    assert "n/a" in "\n".join(table_lines(w, SORT_KEYS[0], 80))


@pytest.mark.parametrize("n, words", [
    (1, "warm-up request"), (5, "past the last request"), (2, "profiler windows trace"),
    (0, "positive integer")])
def test_attribute_request_refusals(n, words):
    from trainer.infer_config import InferConfig

    with pytest.raises(ValueError, match=words):
        InferConfig(device="cpu", requests=4, attribute_request=n)
    InferConfig(device="cpu", requests=4, attribute_request=2, profile_phase="none")


def _rows(blocks: int) -> list[dict]:
    rows = [{"module": "", "params_bytes": 0, "kv_cache_bytes": 0, "prefill_peak_bytes": 900,
             "decode_peak_bytes": 90}]
    for i in range(blocks):
        for child, kv, peak in (("attn", 100, 500), ("mlp", 0, 300)):
            rows.append({"module": f"h.{i}.{child}", "params_bytes": 10, "kv_cache_bytes": kv,
                         "prefill_peak_bytes": peak + i, "decode_peak_bytes": peak // 10})
        rows.append({"module": f"h.{i}", "params_bytes": 1, "kv_cache_bytes": 0,
                     "prefill_peak_bytes": 800, "decode_peak_bytes": 80})
    rows.append({"module": "h", "params_bytes": 0, "kv_cache_bytes": 0})
    return rows


def test_rows_aggregate_to_blocks_and_their_children():
    rows = _rows(3)
    level = blocks_level(rows)
    assert level == 2
    blocks = {r["module"]: r for r in at_level(rows, level)}
    assert blocks["h.1"]["params_bytes"] == 21 and blocks["h.1"]["kv_cache_bytes"] == 100
    assert blocks["h.1"]["prefill_peak_bytes"] == 800  # its own peak, never summed
    kids = {g["module"]: g for g in groups(rows, level)}
    assert kids["h.*.attn"]["members"] == 3 and kids["h.*.attn"]["kv_cache_bytes"] == 300
    assert kids["h.*.attn"]["prefill_peak_bytes"] == 502  # the largest
    assert largest(rows, "prefill_peak_bytes") == ("h.* (3 alike)", 800)


def test_bounded_rows_keep_the_totals():
    from probes.instruments.infer_attribution import bounded

    rows = _rows(200)  # 601 rows
    out = bounded(rows, max_rows=300)
    assert len(out) <= 300
    for key in ("params_bytes", "kv_cache_bytes"):
        assert sum(r.get(key, 0) for r in out) == sum(r.get(key, 0) for r in rows)
    kept = {r["module"]: r for r in out}
    assert kept["h.7"]["prefill_peak_bytes"] == 800  # a folded parent keeps its own peak


@pytest.mark.parametrize("width", [40, 76, 116])
def test_table_fits_and_sorts(width):
    data = {"request": 3, "steps": [17, 18], "modules": _rows(4), "batch_size": 2,
            "context_tokens": 9, "kv_cache_total_bytes": 400, "params_total_bytes": 84,
            "hints": ["a hint long enough to wrap " * 4]}
    lines = table_lines(data, SORT_KEYS[0], width)
    assert all(len(ln) <= width for ln in lines), lines
    assert "KV cache▼" in lines[0] or "KV cach" in lines[0]
    assert lines[1].startswith("h.")
    assert any(ln.startswith(" h.*.attn") for ln in lines)
    assert next_sort_key(SORT_KEYS[-1]) == SORT_KEYS[0]
    assert table_title(18, data, "prefill_peak_bytes").startswith(
        "modules · request 3, steps 17–18 · by pf peak")
