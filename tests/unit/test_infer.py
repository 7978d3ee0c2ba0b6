"""`memtop infer`: prefill/decode rows, the KV cache against its formula, the phase profiler
windows, the report, weights from `memtop train`, and the refusals (one line, exit 2; in a real
process: tests/integration/test_infer_process.py)."""

from __future__ import annotations

import json
import pickle

import pytest
from factories import in_thread, make_sample, resolved_amp, run_infer

from probes import records as R
from probes.records import StepSample
from probes.runfolder import create_run_dir, read_metrics
from probes.tools.kvcache import DTYPE_BYTES, admission, kv_bytes_per_token, kv_cache_bytes


def test_kv_formula():
    # 2 (K and V) × layers × B × T × dim × bytes/element
    assert kv_cache_bytes(4, 8, 128, 128, 2) == 2 * 4 * 8 * 128 * 128 * 2 == 2 * 1024 ** 2
    assert kv_bytes_per_token(4, 128, 4) == 4096
    adm = admission(budget_bytes=10_000, budget_source="--max-memory", used_bytes=2_000,
                    weights_bytes=1_000, kv_bytes_per_sequence=700, temp_bytes_per_sequence=100,
                    seq_len=16)
    assert adm.sequences_fit == 10 and "KV cache" in adm.limit
    assert admission(1_000, "x", 2_000, 1_500, 10, 10, 4).sequences_fit == 0


def test_rows_have_phases_and_the_cache_grows_as_predicted(tmp_path):
    code, run_dir, steps, events = run_infer(tmp_path)
    assert code == 0
    phases = [s["phase"] for s in steps]
    assert phases == (["prefill"] + ["decode"] * 7) * 2
    samples = [StepSample.from_json(s) for s in steps]
    # K/V come out of the linear layer in the run's autocast dtype: bf16 2 bytes, fp32 4
    bpe = DTYPE_BYTES[resolved_amp(run_dir)]
    for s in samples:
        assert s.kv_cache_predicted_bytes == kv_cache_bytes(1, 2, s.context_tokens, 32, bpe)
        assert s.kv_cache_bytes == s.kv_cache_predicted_bytes
        assert s.loss is None and s.tokens == (16 if s.phase == "prefill" else 2)
    first = [s for s in samples if s.request == 1]
    assert [s.context_tokens for s in first] == list(range(8, 16))
    growth = {b.kv_cache_bytes - a.kv_cache_bytes
              for a, b in zip(first[1:-1], first[2:], strict=True)}
    assert growth == {kv_cache_bytes(1, 2, 1, 32, bpe)}  # linear: one position per decode step
    kinds = [e["event"] for e in events]
    assert kinds.count(R.REQUEST_DONE) == 2 and R.ADMISSION in kinds
    started = next(e for e in events if e["event"] == R.RUN_STARTED)
    assert started["mode"] == "infer"
    assert started["switches"] == {"eval": True, "inference_mode": True, "grad_scaler": None}
    base = next(e for e in events if e["event"] == R.CACHE_BASELINE)
    assert base["same_tokens"] is True and base["tokens"] == 4
    assert kinds[-1] == R.RUN_FINISHED and events[-1]["reason"] == "finished"
    # training rows stay as they were: no inference fields in their JSON
    train_row = make_sample(1, amp="off").to_json()
    assert "phase" not in train_row and "kv_cache_bytes" not in train_row


def test_report_has_both_phases(tmp_path):
    from probes.analysis.report.build import write_report

    code, run_dir, _, _ = run_infer(tmp_path, profile_phase="both", new_tokens=8)
    assert code == 0
    md = write_report(run_dir).read_text()
    report = json.loads((run_dir / "report.json").read_text())
    res = report["results"]
    assert report["mode"] == "infer"
    assert res["ttft_ms_p50"] > 0 and res["decode_ms_p50"] > 0 and res["decode_ms_p95"] > 0
    assert res["prefill_tokens_per_s"] > 0 and res["decode_tokens_per_s"] > 0
    assert res["kv_error_max"] == 0.0 and res["baseline"]["same_tokens"] is True
    assert [w["phase"] for w in report["profiles"]] == ["prefill", "decode"]
    assert all(w["status"] == "done" and w["top_ops"] for w in report["profiles"])
    for text in ("TTFT p50 / p95", "decode per token p50 / p95", "### prefill", "### decode",
                 "Cache-off baseline", "Admission"):
        assert text in md


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_phase_labels_in_the_profiler_trace(tmp_path, phase):
    code, run_dir, steps, events = run_infer(tmp_path, profile_phase=phase, baseline_tokens=0)
    assert code == 0
    done = [e for e in events if e["event"] == R.PROFILE_DONE]
    assert len(done) == 1 and done[0]["phase"] == phase
    trace = json.loads((run_dir / done[0]["dir"] / "trace.json").read_text())
    labels = {e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation"}
    other = "decode" if phase == "prefill" else "prefill"
    assert phase in labels and other not in labels  # steps of one phase only
    profiled = [s for s in steps if s["profiling"]]
    assert profiled and {s["phase"] for s in profiled} == {phase}
    assert all(s["request"] == 2 for s in profiled)


def test_profile_request_windows_the_next_request(tmp_path):
    """The dashboard's `p`: both phases' windows in the request after the one running."""
    from probes.control.requests import Request, RunControl

    control = RunControl()
    control.submit(Request("profile", source="keyboard"))  # taken before step 1 (request 1)
    code, _, steps, events = run_infer(tmp_path, control=control, requests=3,
                                       baseline_tokens=0)
    assert code == 0
    done = [e for e in events if e["event"] == R.PROFILE_DONE]
    # each window's table is analysed in its own child: the two may finish in either order
    assert sorted(e["phase"] for e in done) == ["decode", "prefill"]
    assert {s["request"] for s in steps if s["profiling"]} == {2}


def _weights(tmp_path, **change):
    """A real memtop weights file of the tiny shape (saved as `memtop train` saves it)."""
    from trainer.checkpoint import save_weights
    from trainer.model import GPT, GPTConfig

    def make():
        model = GPT(GPTConfig(block_size=32, n_layer=1, n_head=2, n_embd=32))
        path = tmp_path / "weights.pt"
        save_weights(model, path, step=1)
        return path

    return in_thread(make)


def test_train_saves_weights_and_infer_reads_them(tmp_path, tiny_config):
    from trainer.checkpoint import read_weights
    from trainer.loop import Trainer

    config = tiny_config(steps=2)
    run_dir = create_run_dir(config.run_dir)
    assert in_thread(Trainer(config, run_dir, listen=False, freeze_gc=False).run) == 0
    header, state = read_weights(run_dir / "weights.pt")
    assert header["model"]["n_layer"] == 1 and header["step"] == 2
    _, events, _ = read_metrics(run_dir / "metrics.jsonl")
    saved = next(e for e in events if e["event"] == R.WEIGHTS_SAVED)
    assert saved["path"] == "weights.pt" and saved["bytes"] > 0
    code, infer_dir, steps, ievents = run_infer(tmp_path, weights=str(run_dir), layers=None,
                                                heads=None, dim=None, block_size=None)
    assert code == 0 and steps
    started = next(e for e in ievents if e["event"] == R.RUN_STARTED)
    assert started["weights"].endswith("weights.pt")
    off = tiny_config(steps=1, save_weights=False)
    run2 = create_run_dir(off.run_dir)
    assert in_thread(Trainer(off, run2, listen=False, freeze_gc=False).run) == 0
    assert not (run2 / "weights.pt").exists()


def _refused(capsys, argv, *words):
    """The CLI in this process (torch work off the main thread): exit 2, one line, no run."""
    from tui.cli import main

    capsys.readouterr()
    assert in_thread(main, argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in err, err


def test_refusals(tmp_path, capsys):
    import torch

    args = ["infer", "--headless", "--device", "cpu", "--run-dir", str(tmp_path / "runs")]
    _refused(capsys, [*args, "--prompt-len", "100", "--new-tokens", "64", "--block-size", "128"],
             "block size 128")  # typed, all three (untyped, a fresh model's block follows)
    good = _weights(tmp_path)
    _refused(capsys, [*args, "--weights", str(good), "--layers", "3"], "--layers 3",
             "does not match")
    _refused(capsys, [*args, "--weights", str(good), "--new-tokens", "30"], "block size 32")

    def tamper():  # a memtop header whose tensors do not fit its model
        data = torch.load(good, weights_only=True)
        data["state_dict"]["lm_head.weight"] = torch.zeros(3, 3)
        torch.save(data, tmp_path / "bad.pt")
        torch.save({"w": torch.zeros(2)}, tmp_path / "plain.pt")  # no memtop header

    in_thread(tamper)
    _refused(capsys, [*args, "--weights", str(tmp_path / "bad.pt")], "lm_head.weight")
    _refused(capsys, [*args, "--weights", str(tmp_path / "plain.pt")], "no memtop header")
    # an arbitrary pickled object: weights_only refuses it, nothing is unpickled
    (tmp_path / "evil.pt").write_bytes(pickle.dumps(pytest.MonkeyPatch))
    _refused(capsys, [*args, "--weights", str(tmp_path / "evil.pt")], "never unpickles")
    (tmp_path / "empty").mkdir()
    _refused(capsys, [*args, "--weights", str(tmp_path / "empty")], "has no weights.pt")
    _refused(capsys, [*args, "--profile-phase", "train"], "invalid choice")
    _refused(capsys, [*args, "--attribute-request", "1"], "--attribute-request 1",
             "warm-up")
    assert not (tmp_path / "runs").exists()  # nothing was started


def _decode_step(request: int) -> StepSample:
    """A decode step at context 12 whose KV cache is exactly the formula's."""
    return make_sample(5, loss=None, tokens_per_s=800.0, step_ms=2.5, phase="decode", tokens=2,
                       request=request, context_tokens=12, kv_cache_bytes=1536,
                       kv_cache_predicted_bytes=1536)


def test_infer_line():
    from tui.headless_infer import format_infer_line

    s = _decode_step(request=1)
    line = format_infer_line(s)
    assert line.startswith("decode") and "ctx    12" in line and "+0.0%" in line
    assert "heap used" in line and "heap peak" in line and "alloc " not in line
    # the widest a step can print: a profiled prefill at six-digit steps, GiB-sized counters
    gib = 1024 ** 3
    for device, names in (("cpu", ("heap used", "heap peak")), ("cuda", ("allocated", "peak"))):
        wide = make_sample(123456, loss=None, tokens_per_s=123456.0, step_ms=12345.678,
                           phase="prefill", tokens=4096, request=999, context_tokens=99999,
                           kv_cache_bytes=1023 * gib, kv_cache_predicted_bytes=1000 * gib,
                           allocated_bytes=1023 * gib, peak_allocated_bytes=1023 * gib,
                           profiling=True, device=device)
        text = format_infer_line(wide)
        assert all(len(part) <= 80 for part in text.splitlines()), text
        assert "[profiling]" in text and "+2.3%" in text
        assert all(f"{n} 1023 GiB" in text for n in names), text


def test_pane_texts_fit_80_columns():
    from tui.format_infer import admission_text, kv_lines, phase_lines

    adm = admission(24 * 1024 ** 3, "host RAM", 90 * 1024 ** 2, 3 * 1024 ** 2, 256 * 1024,
                    109 * 1024, 128).to_json()
    wide, narrow = admission_text(adm, 200), admission_text(adm, 78)
    assert "limited by the KV cache" in wide and len(narrow) <= 78
    # an estimate from a budget, to two figures (68694 -> about 69,000), not to the sequence
    assert narrow.startswith("admits about 69,000 × 128-token") and "KV cache" in narrow
    assert "about 69,000 sequences" in wide and "68694" not in wide + narrow
    s = _decode_step(request=2)
    top, sub = kv_lines(s, 128, 38)
    assert len(top) <= 38 and "+0.0%" in top and sub.startswith("ctx 12/128")
    pre = make_sample(4, loss=None, tokens_per_s=400.0, step_ms=40.0, phase="prefill", tokens=16,
                      request=2)
    p_line, d_line = phase_lines([pre], [s], 38)
    assert p_line.startswith("prefill 400 tok/s") and "TTFT p50 40.0 ms" in p_line
    assert d_line.startswith("decode  800 tok/s") and len(d_line) <= 38


def test_report_compares_the_cache_with_heap_used_over_a_measured_request(tmp_path):
    """Like with like: both slopes over the same measured request (not the warm-up), the
    counter by its one name; the warm-up's extra growth said with its figures when clear."""
    from probes.analysis.report.build import write_report
    from probes.analysis.report.sections.infer_results import _kv_cache

    code, run_dir, _, _ = run_infer(tmp_path, requests=3)
    assert code == 0
    md = write_report(run_dir).read_text()
    res = json.loads((run_dir / "report.json").read_text())["results"]
    assert res["slope_request"] == 2  # request 1 warms up; 2 and 3 are as long
    per_position = kv_cache_bytes(1, 2, 1, 32, DTYPE_BYTES[resolved_amp(run_dir)])  # B=2
    assert res["kv_slope_bytes_per_position"] == res["kv_bytes_per_position"] == per_position
    assert res["warmup_allocated_slope_bytes_per_position"] is not None
    assert "Across request 2's decode steps" in md and "heap used grew" in md
    assert "allocator's counter" not in md
    # the budget is host RAM: an estimate in the thousands, rounded and said to be one
    fit = res["admission"]["sequences_fit"]
    assert fit > 1000 and f"**about {round(fit, -(len(str(fit)) - 2)):,} concurrent" in md
    assert f"{fit} concurrent" not in md
    # the default CPU bf16 run's figures (docs/INFERENCE.md): request 1 grew 1110.6 KiB per
    # position, request 3 17.5 KiB, the cache 16 KiB
    kib = 1024.0
    res.update(warmup_allocated_slope_bytes_per_position=1110.6 * kib, slope_request=3,
               allocated_slope_bytes_per_position=17.5 * kib, kv_bytes_per_position=16 * 1024,
               kv_slope_bytes_per_position=16 * kib, device="cpu", amp="bf16",
               attention="explicit")
    text = " ".join(_kv_cache(res))
    assert ("In request 1 (the warm-up) heap used grew 1.1 MiB per position, 1.1 MiB more than "
            "in request 3") in text and "oneDNN" in text and "17.5 KiB per position" in text
    assert "oneDNN" not in " ".join(_kv_cache({**res, "attention": "sdpa"}))
    # fp32: request 1 grew as the others did; nothing to explain
    res.update(warmup_allocated_slope_bytes_per_position=32 * kib, amp="off",
               allocated_slope_bytes_per_position=32 * kib, kv_bytes_per_position=32 * 1024)
    assert "warm-up" not in " ".join(_kv_cache(res))
