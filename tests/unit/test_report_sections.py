"""The report's sections (probes/analysis/report/sections/): one ordered list per kind of run
drives both report.json (each key built by exactly one section) and report.md (its parts in the
list's order), and every value is read through the one row parser (probes/runfolder/reader.py)
and the records' event specs (probes/records/events.py). Run folders are written by hand here:
the sections read files only."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from factories import TINY

from probes.analysis.report import ReportError, build_report, write_report
from probes.analysis.report.context import load_context
from probes.analysis.report.sections import SECTIONS
from probes.runfolder import RunFolderError, read_config, read_rows, require_config

TRAIN_KEYS = {"report_version", "run_dir", "generated_at", "complete", "incomplete_reasons",
              "rows", "metrics_file", "finding", "hardware", "software", "model", "input", "mode",
              "amp", "warmup_steps", "measurement", "results", "step_split", "ranks", "ledger",
              "ledger_events", "live_fit", "profiles", "leaks", "leak_timing", "status"}
INFER_KEYS = {"report_version", "run_dir", "generated_at", "complete", "incomplete_reasons",
              "rows", "finding", "hardware", "software", "model", "input", "mode", "amp",
              "results", "profiles", "status"}
INFER_CONFIG = {"mode": "infer", "device": "cpu", "layers": 1, "heads": 2, "dim": 32,
                "block_size": 64, "batch_size": 2, "prompt_len": 8, "new_tokens": 3,
                "requests": 2}


def _lines(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _train_rows(extra: list[dict]) -> list[dict]:
    rows = [{"event": "run_started", "step": 0, "time_s": 0.0, "device": "cpu",
             "device_name": "CPU", "amp": "bf16", "params": 21984,
             "system": {"cpu_model": "test CPU", "cpu_count": 2, "ram_bytes": 2**30}}]
    rows += [{"step": s, "time_s": s / 10, "loss": 5.0 - s / 10, "tokens_per_s": 640.0,
              "step_ms": 100.0, "peak_allocated_bytes": 4096, "reserved_bytes": 8192,
              "driver_used_bytes": 2**20, "skipped_steps": 0} for s in range(1, 6)]
    rows.append({"event": "ledger", "step": 3, "sampled_step": 3, "allocated_bytes": 4096,
                 "lines": [{"name": "parameters", "measured_bytes": 2048}]})
    return rows + extra + [{"event": "run_finished", "step": 5, "time_s": 0.6,
                            "reason": "finished"}]


def _run(tmp_path: Path, config: dict, rows: list[dict], ranks: int = 0) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(config))
    if ranks:
        for rank in range(ranks):
            (run_dir / f"metrics-rank-{rank}.jsonl").write_text(_lines(rows))
    else:
        (run_dir / "metrics.jsonl").write_text(_lines(rows))
    return run_dir


def _infer_rows() -> list[dict]:
    rows: list[dict] = [{"event": "run_started", "step": 0, "time_s": 0.0, "device": "cpu",
                         "amp": "bf16", "params": 21984, "mode": "infer", "weights": "fresh",
                         "kv_bytes_per_token": 256}]
    step = 0
    for request in (1, 2):
        for i in range(4):
            step += 1
            rows.append({"step": step, "time_s": step / 10, "step_ms": 5.0 if i else 20.0,
                         "phase": "decode" if i else "prefill", "request": request,
                         "tokens": 2 if i else 16, "context_tokens": 8 + i,
                         "kv_cache_bytes": 512 * (8 + i), "kv_cache_predicted_bytes": 512 * (8 + i),
                         "allocated_bytes": 4096 + 512 * i})
        rows.append({"event": "request_done", "step": step, "request": request, "ttft_ms": 20.0})
    return rows + [{"event": "run_finished", "step": step, "time_s": 1.0, "reason": "finished"}]


@pytest.mark.parametrize(("case", "expected"), [
    ("train", TRAIN_KEYS), ("baseline", TRAIN_KEYS | {"baseline"}), ("infer", INFER_KEYS)])
def test_each_key_of_report_json_is_built_by_one_section(tmp_path, case, expected):
    if case == "infer":
        run_dir = _run(tmp_path, INFER_CONFIG, _infer_rows())
    else:
        config = dict(TINY, steps=5, **({"baseline": str(tmp_path / "none")}
                                        if case == "baseline" else {}))
        run_dir = _run(tmp_path, config, _train_rows([]))
    ctx = load_context(run_dir)
    owners: dict[str, int] = {}
    sections = SECTIONS[ctx.mode]
    for i in sorted(range(len(sections)), key=lambda i: sections[i].summary):
        part = sections[i].build(ctx) or {}
        for key in part:
            assert key not in owners, f"{key} built by sections {owners[key]} and {i}"
            owners[key] = i
        ctx.built.update(part)
    assert set(owners) == expected
    assert set(build_report(run_dir)) == expected


def test_report_md_follows_the_sections_order(tmp_path):
    """Every train section present: two ranks, a baseline that cannot be read, an error."""
    error = {"event": "error", "step": 5, "error_type": "RuntimeError", "message": "boom"}
    run_dir = _run(tmp_path, dict(TINY, steps=5, baseline=str(tmp_path / "none")),
                   _train_rows([error]), ranks=2)
    md = write_report(run_dir).read_text()
    assert re.findall(r"^#{1,2} .*?(?=:|$)", md, re.MULTILINE) == [
        "# memtop report", "## Finding", "## Setup", "## Results", "## Where the step went",
        "## Ranks",
        "## Memory ledger", "## Profiler windows", "## Leak and memory events",
        "## Against the baseline", "## Errors"]
    finding = md.split("## Finding")[1].split("## Setup")[0]  # built last, rendered second
    assert "The run finished after 5 steps" in finding and "largest ledger line" in finding
    ranks = md.split("## Ranks")[1].split("## Memory ledger")[0]  # counters by their one name
    assert "| heap peak " in ranks and "| peak heap held " in ranks and "| peak RSS " in ranks
    assert not re.search(r"peak alloc|peak resv|driver peak|driver-level", ranks)


def test_inference_report_md_follows_its_sections(tmp_path):
    md = write_report(_run(tmp_path, INFER_CONFIG, _infer_rows())).read_text()
    assert re.findall(r"^#{1,2} .*?(?=:|$)", md, re.MULTILINE) == [
        "# memtop inference report", "## Finding", "## Setup", "## Results", "## KV cache",
        "## Cache-off baseline", "## Admission", "## Profiler windows, one per phase"]


def test_event_fields_are_checked_by_the_records_specs(tmp_path):
    """Fields the records declare are type-checked (a wrong type is dropped, so the report
    shows n/a); fields no kind declares are kept as recorded."""
    leak = {"event": "leak_suspected", "step": 4, "counter": "host_heap",
            "bytes_per_step": 2048.0, "since_step": 2, "likely_cause": 5, "note": "kept"}
    done = {"event": "profile_done", "step": 4, "dir": "profiles/step-4", "sort_by": "cpu",
            "top_ops": [{"name": "aten::mm", "calls": 3, "self_cpu_us": 10.0,
                         "user_annotation": "no"}]}
    report = build_report(_run(tmp_path, dict(TINY, steps=5), _train_rows([leak, done])))
    (shown,) = report["leaks"]
    assert "likely_cause" not in shown and shown["note"] == "kept"
    assert shown["bytes_per_step"] == 2048.0
    (op,) = report["profiles"][0]["top_ops"]
    assert "user_annotation" not in op and op["calls"] == 3


def test_rows_are_read_by_the_one_parser(tmp_path):
    """A line that is not UTF-8 JSON is unreadable for the report as for every other reader."""
    run_dir = _run(tmp_path, dict(TINY, steps=5), _train_rows([]))
    metrics = run_dir / "metrics.jsonl"
    metrics.write_bytes(metrics.read_bytes() + b'{"step": 6, "note": "\xff"}\n')
    report = build_report(run_dir)
    assert report["rows"]["unreadable"] == read_rows(metrics).bad == 1
    assert report["rows"]["steps"] == len(read_rows(metrics).steps) == 5


@pytest.mark.parametrize(("config_text", "words"), [
    (None, "has no config.json"), ("{ batch_size: 4", "is not valid JSON (JSONDecodeError)"),
    ("[1, 2]", "is not a JSON object")])
def test_config_is_read_by_the_one_reader(tmp_path, config_text, words):
    """The report's strict reading and a viewer's lenient one are the same reader; the report's
    own checks (shape fields, warmup) run over what it returns."""
    run_dir = _run(tmp_path, dict(TINY, steps=5), _train_rows([]))
    if config_text is None:
        (run_dir / "config.json").unlink()
    else:
        (run_dir / "config.json").write_text(config_text)
    with pytest.raises(RunFolderError, match=re.escape(words)):
        require_config(run_dir)
    assert read_config(run_dir) == {}
    with pytest.raises(ReportError, match=re.escape(words)):
        build_report(run_dir)
