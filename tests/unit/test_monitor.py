"""The public Monitor API on models that are not memtop's GPT: the examples' loops, AMP with a
GradScaler, gradient accumulation, controls through the socket, and the errors bad use gets."""

from __future__ import annotations

import json
import sys
import threading

import pytest
import torch
from factories import ROOT, in_thread, metrics_rows
from torch import nn

from probes import MemtopError, Monitor
from probes.control.unix_socket import request as send
from probes.records.errors import MonitorArgumentError, MonitorStateError
from probes.runfolder import RunFolderError

sys.path.insert(0, str(ROOT / "examples"))
import grad_accum  # noqa: E402
import own_loop  # noqa: E402


def _newest(folder):
    (run,) = [p for p in folder.iterdir() if p.is_dir()]
    return run


def test_own_loop_example_writes_a_complete_run_folder(tmp_path):
    # --device cpu: the example picks CUDA (and fp16) where there is one
    assert in_thread(own_loop.main, ["--steps", "7", "--batch-size", "4", "--device", "cpu",
                                     "--run-dir", str(tmp_path)]) == 0
    run = _newest(tmp_path)
    steps, events = metrics_rows(run)
    assert [r["step"] for r in steps] == list(range(1, 8))
    for r in steps:  # every row has the counters, measured
        assert r["allocated_bytes"] > 0 and r["host_rss_bytes"] > 0 and r["step_ms"] > 0
        assert r["samples_per_s"] > 0 and r["tokens_per_s"] is None and r["amp"] == "bf16"
    assert events[0]["event"] == "run_started" and events[-1]["event"] == "run_finished"
    config = json.loads((run / "config.json").read_text())
    assert config["monitor"]["model"] == "SmallCNN"
    assert config["amp"] == "auto" and config["resolved_amp"] == "bf16"  # seen in the forward
    assert config["resolved_device"] == "cpu"
    report = (run / "report.md").read_text()
    assert "SmallCNN (the training loop's own model)" in report and "samples/s" in report
    assert not (run / "control.sock").exists()  # closed: nothing listens any more


def test_gradient_accumulation_counts_optimizer_steps(tmp_path):
    assert in_thread(grad_accum.main, ["--steps", "3", "--micro-batches", "3", "--seq-len", "8",
                                       "--batch-size", "2", "--run-dir", str(tmp_path)]) == 0
    steps, _ = metrics_rows(_newest(tmp_path))
    assert [r["step"] for r in steps] == [1, 2, 3]  # one row per optimizer step
    assert all(r["micro_batches"] == 3 for r in steps)
    # tokens/s counts every micro-batch's tokens over the whole optimizer step
    assert all(abs(r["tokens_per_s"] * r["step_ms"] / 1000 - 3 * 2 * 8) < 1e-6 for r in steps)


def _amp_scaler_run(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x, y = torch.randn(4, 8), torch.randn(4, 4)
    unchanged = None
    with Monitor(model, opt, scaler=scaler, samples_per_step=4, run_dir=tmp_path,
                 warmup_steps=1, listen=False) as mon:
        for i in range(1, 6):
            with mon.step() as step:
                with torch.autocast("cpu", dtype=torch.float16):
                    loss = nn.functional.mse_loss(model(x).float(), y)
                if i == 3:
                    loss = loss * float("inf")  # an overflowing step, as fp16 sometimes has
                scaler.scale(loss).backward()
                before = model[0].weight.detach().clone()
                scaler.step(opt)
                scaler.update()
                if i == 3:
                    unchanged = torch.equal(before, model[0].weight)
                opt.zero_grad(set_to_none=True)
                step.set(loss=loss)
    return mon, unchanged


def test_amp_with_gradscaler_counts_the_skipped_step(tmp_path):
    mon, unchanged = in_thread(_amp_scaler_run, tmp_path)
    assert unchanged  # the scaler really skipped the optimizer step
    steps, _ = metrics_rows(mon.run_dir)
    assert [r["skipped_steps"] for r in steps] == [0, 0, 1, 1, 1]
    assert [r["scale"] for r in steps] == [1024.0, 1024.0, 512.0, 512.0, 512.0]
    assert steps[2]["loss"] is None  # inf has no JSON spelling: the row says null, not a number
    assert steps[1]["loss"] > 0 and all(r["amp"] == "fp16" for r in steps)


def _ledger_run(tmp_path):
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 8 * 8, 10))
    opt = torch.optim.AdamW(model.parameters())
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    with Monitor(model, opt, run_dir=tmp_path, warmup_steps=1, max_steps=3,
                 listen=False) as mon:
        for _ in range(3):
            with mon.step() as step:
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                step.set(loss=loss)
    return mon


def test_ledger_on_a_model_that_is_not_the_gpt_says_measured_only(tmp_path):
    mon = in_thread(_ledger_run, tmp_path)
    _, events = metrics_rows(mon.run_dir)
    ledger = next(e for e in events if e["event"] == "ledger")
    lines = {ln["name"]: ln for ln in ledger["lines"]}
    assert lines["saved activations"]["formula"] == "measured only"
    assert lines["saved activations"]["measured_bytes"] > 0
    assert lines["saved activations"]["predicted_bytes"] is None
    # what is exact for any model keeps its prediction: AdamW holds 2 fp32 tensors per param
    params = sum(p.numel() for p in mon.model.parameters())
    assert lines["optimizer state"]["predicted_bytes"] == 2 * params * 4
    assert lines["parameters"]["measured_bytes"] == params * 4
    report = (mon.run_dir / "report.md").read_text()
    assert "measured only" in report and "FLOPs per token of this model are unknown" in report


def _stopped_from_socket(tmp_path, asked: threading.Event, answer: dict):
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 4)
    with Monitor(model, opt, run_dir=tmp_path, warmup_steps=0) as mon:
        while not mon.should_stop:
            with mon.step():
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
            if mon.step_count == 2 and not asked.is_set():
                answer.update(send(mon.server.path, {"request": "stop", "source": "test"}))
                asked.set()
            if mon.step_count > 1000:
                break
    return mon


def test_a_viewer_stop_request_ends_the_loop_through_should_stop(tmp_path):
    asked, answer = threading.Event(), {}
    mon = in_thread(_stopped_from_socket, tmp_path, asked, answer)
    assert answer["ok"] and mon.step_count == 3  # acted on at the next step boundary
    _, events = metrics_rows(mon.run_dir)
    assert events[-1] == {**events[-1], "event": "run_finished", "reason": "stopped by test"}


def test_bad_use_gets_one_memtop_error(tmp_path):
    model, other = nn.Linear(2, 2), nn.Linear(2, 2)
    with pytest.raises(MonitorArgumentError, match="none of this model's parameters") as err:
        Monitor(model, torch.optim.SGD(other.parameters(), lr=0.1), run_dir=tmp_path)
    assert isinstance(err.value, MemtopError) and isinstance(err.value, ValueError)
    with pytest.raises(MonitorArgumentError, match="tokens_per_step must be a positive"):
        Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1), tokens_per_step=0)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(RunFolderError) as err:
        Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=blocker / "runs")
    assert isinstance(err.value, MemtopError) and "\n" not in str(err.value)

    mon = Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=tmp_path,
                  listen=False, write_report=False)
    with mon.step(), pytest.raises(MonitorStateError, match="steps do not nest"):
        mon.step()
    mon.close()
    with pytest.raises(MonitorStateError, match="closed") as err:
        mon.step()
    assert isinstance(err.value, MemtopError) and isinstance(err.value, RuntimeError)
    mon.close()  # twice is fine


def _wrapped_runs(tmp_path):
    import torch.distributed as dist

    x = torch.randn(4, 8)
    out = {}
    compiled = torch.compile(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)),
                             backend="eager")  # eager: the wrapper without a C++ toolchain
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
        for name, model in (("compiled", compiled), ("ddp", ddp)):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            with Monitor(model, opt, run_dir=tmp_path / name, warmup_steps=1,
                         listen=False) as mon:
                for _ in range(3):
                    with mon.step() as step:
                        loss = model(x).sum()
                        loss.backward()
                        opt.step()
                        opt.zero_grad()
                        step.set(loss=loss)
            out[name] = mon
    finally:
        dist.destroy_process_group()
    return out


def test_models_wrapped_by_torch_compile_or_ddp(tmp_path):
    for name, mon in in_thread(_wrapped_runs, tmp_path).items():
        steps, events = metrics_rows(mon.run_dir)
        assert [r["micro_batches"] for r in steps] == [1, 1, 1], name  # forward hook fired
        assert events[-1]["reason"] == "finished", name
