"""benchmarks/gpu/check.py on a machine without a GPU: the claim registry, the runner that keeps
one failing, raising or hanging claim from stopping the rest and writes its summary after every
claim, a run's model freed when it ends, and the analysis of the fixed claims on recorded rows
(labelled stand-ins for what only a GPU produces). The whole script on CPU:
tests/integration/test_gpu_run.py."""

from __future__ import annotations

import gc
import json
import time
import weakref

import pytest
from factories import TINY, import_benchmark

reg = import_benchmark("gpu.registry")
gpu_check = import_benchmark("gpu.check")
reg.load_claim_modules()
probes_claims = import_benchmark("gpu.claims.probes")
profiler_claims = import_benchmark("gpu.claims.profiler")


def _claim(name, fn, *, needs_s=0.0, limit_s=60.0, cuda_only=False):
    return reg.Claim(name, f"{name} holds", "test", fn, needs_s, limit_s, 50, cuda_only,
                     "test", 0)


def _ctx(tmp_path, device="cpu", budget_s=60.0):
    return reg.Ctx(tmp_path, device, time.monotonic() + budget_s, log=lambda _m: None)


def test_claims_register_once_each_in_their_order():
    names = [c.name for c in reg.ordered_claims()]
    assert len(names) == len(set(names)) >= 35
    assert names[:2] == ["cuda_device_seen", "memtop_dependencies_import"]
    assert names[-1] == "runs_free_their_memory"
    with pytest.raises(ValueError, match="declared twice"):
        reg.claim("sample_cost", "again", group="probes")(lambda ctx: None)


def test_a_failing_raising_or_hanging_claim_is_recorded_and_the_next_runs(tmp_path):
    ctx = _ctx(tmp_path)

    def raises(_ctx):
        raise KeyError("no such counter")

    def hangs(_ctx):
        time.sleep(30)

    got = {c.name: gpu_check.run_one(c, ctx) for c in (
        _claim("raises", raises), _claim("hangs", hangs, limit_s=1.0),
        _claim("wrong", lambda _c: "yes"), _claim("fails", lambda _c: reg.Outcome.check(
            False, "3 != 4")), _claim("holds", lambda _c: reg.Outcome.check(True, "4 == 4")),
        _claim("cuda", lambda _c: reg.Outcome.check(True, ""), cuda_only=True),
        _claim("big", lambda _c: reg.Outcome.check(True, ""), needs_s=3600))}
    assert (got["raises"].status, got["raises"].detail) == ("FAIL", "KeyError: 'no such counter'")
    assert "raise KeyError" in got["raises"].traceback
    assert got["hangs"].status == "FAIL" and "did not finish" in got["hangs"].detail
    assert got["wrong"].status == "FAIL" and "returned str" in got["wrong"].detail
    assert (got["fails"].status, got["holds"].status) == ("FAIL", "PASS")
    assert got["cuda"].status == "NOT RUN" and "CUDA only" in got["cuda"].detail
    assert got["big"].status == "NOT RUN" and "time budget" in got["big"].detail


def test_the_summary_lists_every_claim_as_it_goes(tmp_path):
    meta = {"device": "cpu", "device_name": None, "torch": "t", "torch_cuda": None,
            "python": "3", "started": time.time(), "started_utc": "now", "command": "c"}
    results = [gpu_check.Result("a", "g", "a holds"), gpu_check.Result("b", "g", "b holds")]
    results[0].status, results[0].detail = "FAIL", "a | b differ"
    assert gpu_check.write_summary(tmp_path, results, meta) == 1
    text = (tmp_path / "summary.md").read_text()
    assert "**0 PASS, 1 FAIL, 1 NOT RUN** of 2 claims; failed: a" in text
    assert "| **NOT RUN** | 0 | not reached |" in text and "a / b differ" in text
    data = json.loads((tmp_path / "summary.json").read_text())
    assert [c["status"] for c in data["claims"]] == ["FAIL", "NOT RUN"] and not data["ok"]


def test_a_shared_run_is_made_once_and_its_error_reaches_every_claim(tmp_path):
    ctx = _ctx(tmp_path)
    calls = []
    assert ctx.shared("k", lambda: calls.append(1) or {"rows": [1]}) == {"rows": [1]}
    assert ctx.shared("k", lambda: calls.append(2)) == {"rows": [1]} and calls == [1]

    def broken():
        raise OSError("disk full")

    for _ in range(2):
        with pytest.raises(RuntimeError, match="shared run 'bad' failed: OSError: disk full"):
            ctx.shared("bad", broken)


def test_a_run_gives_back_its_records_and_frees_its_model(tmp_path):
    """The old check's runs each left a model alive (gc.freeze() kept their cycles): a claim's
    run now returns plain records, and its model is gone as soon as ctx.train returns."""
    from probes.instruments.hooks import StepHook

    class Spy(StepHook):
        model = None

        def setup(self, ctx):
            Spy.model = weakref.ref(ctx.model)

    ctx = _ctx(tmp_path)
    run = ctx.train("tiny", ctx.config(**dict(TINY, steps=4)), hooks=[Spy()])
    gc.collect()
    assert run.exit_code == 0 and [s.step for s in run.steps()] == [1, 2, 3, 4]
    assert run.events("run_finished") and (run.run_dir / "metrics.jsonl").is_file()
    assert Spy.model is not None and Spy.model() is None


def test_the_step_peak_is_not_compared_at_the_warmup_step():
    """Recorded stand-in rows (no GPU here): memtop reads the warmup step's peak, then resets
    the allocator's peak; a read after it sees the reset value. The old check compared that
    step and would FAIL correct code; a real difference elsewhere is still found."""
    def row(step, peak, truth_peak):
        return {"step": step, "allocated": 10, "truth_allocated": 10, "reserved": 20,
                "truth_reserved": 20, "alloc_retries": 0, "truth_alloc_retries": 0, "ooms": 0,
                "truth_ooms": 0, "step_peak": peak, "truth_step_peak": truth_peak}

    rows = [row(4, 90, 90), row(5, 95, 10), row(6, 90, 90)]
    assert not any(probes_claims._mismatches(rows, warmup=5).values())
    assert probes_claims._mismatches(rows + [row(7, 91, 92)], 5)["step_peak"] == [7]


def test_nvml_with_no_process_for_this_pid_is_not_run_not_passed(tmp_path):
    """Recorded stand-in NVML rows (a sandbox whose PID namespace hides our pid): the old check
    passed while comparing nothing."""
    ctx = _ctx(tmp_path, device="cuda:0")
    hidden = {"step": 30, "reserved": 2 << 30, "memtop_process": None,
              "memtop_device": (2 << 30) + (600 << 20), "nvml_match": "by UUID GPU-x",
              "nvml_fresh": None, "nvml_pids": [4242], "smi_mib": None}
    ctx.cache["probes_fp16"] = ("ok", {"nvml_rows": [hidden]})
    out = probes_claims.nvml_matches_fresh_read(ctx)
    assert out.status == "NOT RUN" and "no process with this pid" in out.detail
    gap = probes_claims.nvml_minus_reserved_gap(ctx)  # the device's figure stands in
    assert gap.status == "PASS" and gap.figures == {"gap_mib": [600.0], "source": "device"}
    ctx.cache["probes_fp16"] = ("ok", {"nvml_rows": [dict(
        hidden, memtop_process=3 << 30, nvml_fresh=(3 << 30) + (8 << 20))]})
    assert probes_claims.nvml_matches_fresh_read(ctx).status == "FAIL"  # 8 MiB apart


def test_key_averages_rows_are_keyed_as_torch_keys_them(tmp_path):
    """Recorded stand-in rows: on CUDA a labelled range has a CPU row and a gpu_user_annotation
    row of the same name; keyed by name alone one hides the other (the old check's FAIL)."""
    def ours(name, dev, ann, calls, self_dev):
        return {"name": name, "on_device": dev, "user_annotation": ann, "calls": calls,
                "self_device_us": self_dev}

    rows = [ours("forward", False, True, 3, 0.0), ours("forward", True, True, 3, 900.0),
            ours("aten::mm", False, False, 12, 400.0), ours("gemm", True, False, 12, 400.0)]
    theirs = {profiler_claims._key(r["name"], r["on_device"], r["user_annotation"]): {
        "calls": r["calls"], "self_device_us": r["self_device_us"]} for r in rows}
    ctx = _ctx(tmp_path, device="cuda:0")
    ctx.cache["profiler_window"] = ("ok", {"ours": rows, "theirs": theirs})
    assert profiler_claims.ops_table_equals_key_averages(ctx).status == "PASS"
    theirs[("forward", True, True)]["self_device_us"] = 700.0
    out = profiler_claims.ops_table_equals_key_averages(ctx)
    assert out.status == "FAIL" and "forward (device)" in out.detail


def test_per_step_sync_counts_and_timing_agreement():
    assert profiler_claims.per_step_counts({1: 0, 2: 3, 3: 4, 4: 5}) == {1: 3, 2: 1, 3: 1}
    assert profiler_claims.per_step_counts({}) == {}
    got = profiler_claims.agreement([10.0, 11.0, 30.0], [10.0, 10.0, 0.0])
    assert got["steps"] == 2 and got["median_ratio"] == pytest.approx(1.05)
    assert profiler_claims.agreement([1.0], [0.0]) is None


def test_split_problems_on_stand_in_rows():
    """Stand-ins for a CUDA run's rows (written here, not recorded): a split read two steps
    late is fine, one missing or read too late is said."""
    split = import_benchmark("gpu.claims.split")
    phases = dict(forward_ms=1.0, backward_ms=2.0, optimizer_ms=0.5, other_ms=0.1)
    good = [dict(step=s, split_step=max(1, s - 2), **phases) for s in range(1, 10)]
    assert split.split_problems(good) == []
    late = good[:5] + [dict(step=6, split_step=1, **phases), dict(step=7, split_step=None)]
    assert split.split_problems(late) == ["step 6: split of step 1", "step 7: no split"]
    blind = [dict(step=5, split_step=5, **dict(phases, backward_ms=None))]
    assert split.split_problems(blind) == ["step 5: backward_ms None"]


@pytest.mark.slow  # 2 × 40 fp16 steps of the small CPU model (fp16 autocast is slow on CPU)
def test_the_scaler_claim_reads_its_truth_at_each_steps_end_not_in_a_batch(tmp_path,
                                                                          monkeypatch):
    """issue 45: the H200 run found the weights untouched on ~29 of 40 steps and memtop's scale
    unequal to the scaler's, where memtop counted the 2 injected inf steps: the claim read its
    truth in a sink, which gets rows in batches (up to 8 steps after their step). Reproduced on
    CPU with torch.amp.GradScaler("cpu") and the rows held back as on a fast GPU step (a
    batch every 8 rows): the sink's way fails, the claim's instrument (end_step) passes."""
    from probes.runfolder import recorder

    monkeypatch.setattr(recorder, "DRAIN_EVERY_S", 3600.0)  # batches of MAX_SOON_ROWS rows
    ctx = _ctx(tmp_path, budget_s=600)
    out = probes_claims.scale_and_skipped_steps(ctx)
    assert out.status == "PASS", out.detail
    data = probes_claims.probe_run(ctx, "fp16")
    assert [r["step"] for r in data["rows"]] == list(range(1, probes_claims.PROBE_STEPS + 1))

    class SinkTruth(probes_claims.GroundTruth):  # the first run's way: the truth in a sink
        def end_step(self, step, tensors, record):
            pass

        def sink(self, record):
            from probes.records import StepSample

            if isinstance(record, StepSample):
                probes_claims.GroundTruth.end_step(self, record.step, None, record)

    late = SinkTruth(False)
    ctx.train("late", ctx.config(amp="fp16", steps=16), sinks=[late.sink],
              hooks=[late, probes_claims.InfGrad({5})])
    untouched = [r["step"] for r in late.rows if r["truth_skipped"]]
    assert len(untouched) > 4  # most rows of each batch: no step between their reads


def test_claims_leave_no_run_of_theirs_alive(tmp_path):
    """runs_free_their_memory on the H200 (issue 45): the culprit claim left the example's
    kept logits (its module-level list outlived the run: 1.5 MiB) and the dashboard claim its
    trainer's model (an app built with freeze_gc=False still froze the gc in its trainer,
    so the run's cycles were never collected: 6.4 MiB)."""
    from trainer.config import TrainConfig
    from tui.app import MemtopApp

    culprits = import_benchmark("gpu.claims.culprits")
    ctx = _ctx(tmp_path)
    data = culprits.culprit_run(ctx, "logits", steps=12)
    assert data["alerts"] or data["culprits"] or data["run_dir"]
    assert culprits.leaky_loops.kept_outputs == []  # released after the run

    cfg = TrainConfig(**dict(TINY, steps=0, run_dir=str(tmp_path)))
    for freeze in (False, True):
        run_dir = tmp_path / f"app-{freeze}"
        run_dir.mkdir()
        app = MemtopApp.for_run(cfg, run_dir, autostart=False, freeze_gc=freeze)
        assert app.ending.trainer.freeze_gc is freeze and app.freeze_gc is freeze


def test_syncs_are_counted_from_the_live_list_as_each_step_begins():
    """one_sync_per_step measured 0 on the H200 (issue 45): the counter marked each step with
    the length of a list filled only when the run ended. Stand-in warnings (written here) arrive
    in the live list as a run's would; each step's count is what arrived since it began."""
    import types
    import warnings

    def warning(text):
        return types.SimpleNamespace(message=UserWarning(text))

    live: list = []
    counter = profiler_claims.SyncCounter(live)
    sync = "called a synchronizing CUDA operation"
    arrivals = {1: [sync, "an unrelated warning"], 2: [sync], 3: [], 4: [sync, sync]}
    for step in range(1, 6):
        counter.marks[step] = counter.syncs_so_far()  # what step_context does
        live.extend(warning(t) for t in arrivals.get(step, []))
    assert profiler_claims.per_step_counts(counter.marks) == {1: 1, 2: 1, 3: 0, 4: 2}
    with warnings.catch_warnings(record=True) as caught:  # sync_warnings' list is the live one
        warnings.simplefilter("always")
        warnings.warn(sync, stacklevel=1)
    assert sum(map(profiler_claims.is_sync_warning, caught)) == 1
