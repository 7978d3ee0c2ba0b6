"""What the framework callbacks share (probes/integrations/common.py), without a framework: the
StepDriver over a real Monitor and a real model, the batch counts, the outputs leak demo, the
missing-framework sentence, and the leak watch's gap across an evaluation or a save. The
callbacks inside the real HF and Lightning Trainers: tests/integration/test_hf_trainer.py and
test_lightning_fit.py."""

from __future__ import annotations

import pytest
import torch
from factories import RecordSink, in_thread, make_sample, metrics_rows, run_context

from probes import records as R
from probes.integrations.common import (
    FrameworkMissing,
    StepDriver,
    batch_counts,
    require,
)
from probes.records import MemtopError, MonitorArgumentError


def test_batch_counts_from_what_frameworks_hand_over():
    ids = torch.zeros(4, 32, dtype=torch.long)
    assert batch_counts({"input_ids": ids, "labels": ids}) == (128, 4)  # HF's dict
    assert batch_counts((ids[:, :16], ids[:, 1:17])) == (64, 4)  # Lightning's (x, y)
    assert batch_counts([torch.rand(8, 3, 4, 4), torch.zeros(8)]) == (None, 8)  # images
    assert batch_counts({"inputs_embeds": torch.rand(2, 5, 8)}) == (10, 2)
    assert batch_counts({"pixel_values": torch.rand(6, 3, 2, 2)}) == (None, 6)
    assert batch_counts(torch.zeros(3, dtype=torch.long)) == (None, 3)  # ids of one dimension
    assert batch_counts("text") == (None, None)


def test_a_missing_framework_names_its_extra():
    with pytest.raises(FrameworkMissing) as err:
        require("memtop_no_such_framework", "lightning", "probes.integrations.lightning")
    assert isinstance(err.value, ImportError) and isinstance(err.value, MemtopError)
    text = str(err.value)
    assert "pip install 'memtop[lightning]'" in text and "\n" not in text


def test_a_wrong_option_fails_where_the_callback_is_made(tmp_path):
    with pytest.raises(MonitorArgumentError, match="'warmup'.*warmup_steps"):
        StepDriver("test", tmp_path, None, None, None, {"warmup": 3})


def _loop(driver: StepDriver, steps: int, micro: int = 2, between_at: int | None = None,
          before_step=None) -> None:
    """A framework's loop, as its hooks call the driver: begin, each micro-batch, end."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    driver.open(model, opt, scaler=None, amp="off", base=driver.run_dir, rank=0,
                world_size=1, max_steps=steps, config={"what": "test"})
    for step in range(1, steps + 1):
        if before_step is not None:
            before_step(step, driver)
        driver.begin()
        total = torch.zeros(())
        for _ in range(micro):
            x = torch.randint(0, 16, (4, 6))
            driver.batch((x, x))
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
            (loss / micro).backward()
            total += loss.detach() / micro
        opt.step()
        opt.zero_grad(set_to_none=True)
        if driver.end(loss=total):
            break
        if step == between_at:
            driver.between(R.EVALUATE, {"metrics": {"eval_loss": 1.5}})
    driver.close()


def test_driver_one_row_per_optimizer_step_with_all_micro_batches(tmp_path):
    driver = StepDriver("test", tmp_path, None, None, None, {"listen": False, "warmup_steps": 2})
    in_thread(_loop, driver, 8, 2, 4)
    (run,) = list(tmp_path.iterdir())
    steps, events = metrics_rows(run)
    assert [r["step"] for r in steps] == list(range(1, 9))
    assert all(r["micro_batches"] == 2 for r in steps)
    for r in steps:  # both micro-batches' tokens over the step's time
        assert r["tokens_per_s"] * r["step_ms"] / 1000 == pytest.approx(2 * 4 * 6, rel=1e-6)
        assert r["samples_per_s"] * r["step_ms"] / 1000 == pytest.approx(2 * 4, rel=1e-6)
        assert r["loss"] is not None
    (ev,) = [e for e in events if e["event"] == R.EVALUATE]
    assert ev["step"] == 4 and ev["metrics"] == {"eval_loss": 1.5}
    assert ev["source"] == "test" and ev["seconds"] >= 0
    assert R.EVENT_KINDS[R.EVALUATE].summary(ev).startswith("evaluation between steps")
    assert events[-1]["event"] == R.RUN_FINISHED and events[-1]["reason"] == "finished"
    assert (run / "report.md").is_file()


def test_outputs_leak_demo_keeps_and_releases_through_requests(tmp_path):
    from probes.control.requests import Request

    kept: list[int] = []

    def requests(step: int, driver: StepDriver) -> None:
        kept.append(len(driver.demo.kept))
        if step == 3:
            driver.monitor.control.submit(Request("leak_start", source="test"))
        if step == 6:
            driver.monitor.control.submit(Request("leak_stop", source="test"))

    driver = StepDriver("test", tmp_path, None, None, None, {"listen": False})
    in_thread(_loop, driver, 8, 2, None, requests)
    (run,) = list(tmp_path.iterdir())
    steps, events = metrics_rows(run)
    # each request is acted on at the next step boundary (step 3's end, step 6's end): steps
    # 4, 5 and 6 keep both micro-batches' outputs, released when step 6 ends
    assert kept == [0, 0, 0, 0, 2, 4, 0, 0]
    started = [e for e in events if e["event"] == R.LEAK_DEMO_STARTED]
    stopped = [e for e in events if e["event"] == R.LEAK_DEMO_STOPPED]
    assert started[0]["kind"] == "outputs" and "kept every step" in started[0]["hint"]
    assert stopped[0]["released_tensors"] == 6
    assert [r["leak_active"] for r in steps] == [False] * 3 + [True] * 3 + [False] * 2
    assert "leak_start" in events[0]["requests"]  # a viewer's l is offered


def test_between_steps_keeps_the_leak_watch_from_comparing_across(tmp_path):
    """A level that moves only across evaluations or saves is not a leak; the same growth
    step after step is."""
    from probes.instruments.hooks import StepTensors
    from probes.instruments.leakwatch import LeakWatch

    def alerts(between: bool) -> list:
        sink = RecordSink()
        watch = LeakWatch()
        watch.setup(run_context(tmp_path, emit=sink, device_total_bytes=2**34))
        for step in range(1, 41):
            sample = make_sample(step, time_s=0.01 * step, step_ms=10.0,
                                 allocated_bytes=2**27 + step * 2**20, host_rss_bytes=2**28)
            watch.end_step(step, StepTensors(None, None), sample)
            if between:
                watch.between_steps(R.SAVE)
        return sink.named(R.LEAK_SUSPECTED)

    assert alerts(between=False)
    assert not alerts(between=True)


async def test_viewer_shows_the_last_logged_loss_between_logging_steps(tmp_path):
    """A finished HF-style run: the loss on steps 5 and 10 only; the pane shows 10's."""
    from factories import wait_for

    from probes.records import Event
    from probes.runfolder import METRICS, json_line
    from tui.app import MemtopApp

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"framework": "transformers"}')
    rows = [Event(R.RUN_STARTED, 0, 0.0, {"device": "cpu", "amp": "off", "params": 10})]
    rows += [make_sample(s, loss=4.0 - s / 10 if s % 5 == 0 else None) for s in range(1, 13)]
    rows.append(Event(R.RUN_FINISHED, 12, 1.3, {"reason": "finished"}))
    (run / METRICS).write_text("".join(json_line(r.to_json()) + "\n" for r in rows))
    app = MemtopApp.for_folder(run, refresh_s=0.1, freeze_gc=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.last_sample is not None and
                       app.last_sample.step == 12, "the final state")
        assert app.last_sample.loss is None
        assert app.panes["loss"].current == pytest.approx(3.0)  # step 10's
        await pilot.press("q")


def test_gpu_check_counts_syncs_per_optimizer_step():
    """benchmarks/gpu/claims/frameworks.py's count (its CUDA run is a claim for a GPU): the
    median of sync-debug warnings between step ends, after the first steps."""
    import warnings

    from factories import import_benchmark

    marks = import_benchmark("gpu.claims.frameworks").SyncMarks([])
    for step in range(1, 13):
        for _ in range(3 if step > 5 else 9):  # first steps: set-up syncs, left out
            marks.caught.append(warnings.WarningMessage(
                "called a synchronizing CUDA operation", UserWarning, "x.py", 1))
        marks.caught.append(warnings.WarningMessage("another warning", UserWarning, "x.py", 2))
        marks.mark()
    assert marks.per_step() == 3
    assert import_benchmark("gpu.claims.frameworks").SyncMarks([]).per_step() is None
