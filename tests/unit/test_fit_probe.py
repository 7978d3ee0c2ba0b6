"""`memtop fit`'s probe on real torch (trainer/fitprobe.py): each point's peak split into
measured parts that sum to it, fit.json rewritten after every point, a real allocation failure
recorded as a point that does not fit (the Monitor and the next point go on), a budget below
the model refused; the memory guard lets a warm-up step's one-off growth pass; the live line's
arithmetic."""

from __future__ import annotations

import pytest
from factories import in_thread, read_jsonl

from probes.analysis.fit import GUARD, OK, OOM, PARTS, fit_points
from probes.analysis.fit_file import read_fit
from probes.analysis.fit_live import LivePeaks, live_fit, live_line
from probes.analysis.fit_plan import probe_grid

MIB = 1024 * 1024


def _probe(tiny_config, tmp_path, points, config=None, **kw):
    from probes.analysis.fit_file import fit_document, write_fit
    from probes.runfolder import create_run_dir
    from trainer.fitprobe import FitProbe

    cfg = tiny_config(**{"steps": 0, "warmup_steps": 0, "save_weights": False, "seq_len": 16,
                         "block_size": 32, **(config or {})})
    run_dir = create_run_dir(str(tmp_path / "runs"))
    written = []

    def on_point(probe):  # as `memtop fit` does: fit.json after every point
        meta = {"device": probe.device_text, "budget_bytes": probe.budget_bytes,
                "headroom_pct": 10.0, "batch_size": cfg.batch_size, "seq_len": cfg.seq_len,
                "max_seq_len": cfg.block_size}
        write_fit(run_dir, fit_document(meta, list(probe.points)))
        written.append(len(probe.points))

    probe = FitProbe(cfg, run_dir, points, on_point=on_point, listen=False, **kw)
    in_thread(probe.run)
    return probe, run_dir, written


def test_each_points_parts_sum_to_its_peak_and_fit_json_follows_the_probe(tiny_config,
                                                                          tmp_path):
    grid = probe_grid(4, 16, "both")
    probe, run_dir, written = _probe(tiny_config, tmp_path, grid, refine=False)
    assert probe.exit_code == 0 and probe.refused is None
    assert [p["status"] for p in probe.points] == [OK] * len(grid)
    specs = {s.name: s for s in PARTS["cpu"]}
    for p in probe.points:
        parts = p["parts"]
        assert set(parts) == set(specs)
        assert sum(v or 0 for v in parts.values()) == p["peak_bytes"]
        assert sum(v or 0 for k, v in parts.items() if specs[k].in_counter) == \
            p["counter_peak_bytes"]
        # the exact tensor parts: the model's own sizes (fp32 master parameters, AdamW)
        assert parts["parameters"] == probe.params * 4
        assert parts["optimizer state"] >= 2 * probe.params * 4
        assert parts["gradients"] == probe.params * 4
        assert parts["saved activations"] > 0 and p["steps"] == 4
    acts = [p["parts"]["saved activations"] for p in probe.points if p["seq_len"] == 16]
    assert acts == sorted(acts) and acts[-1] > acts[0]  # B = 1, 2, 4 at one T
    assert written == list(range(1, len(grid) + 1))  # fit.json after each point
    doc = read_fit(run_dir)
    assert len(doc["points"]) == len(grid) and doc["fit"] is not None
    events = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("event") == "fit_point"]
    assert [(e["batch_size"], e["seq_len"]) for e in events] == grid
    fit = fit_points(probe.points, "cpu")
    assert fit["max_residual"] < 0.05  # on a few MiB of steps over ~400 MiB of process


def test_a_real_allocation_failure_is_a_point_that_does_not_fit(tiny_config, tmp_path):
    """torch's CPU allocator refuses 2**60 bytes at once: a real failure, caught in the step,
    recorded as oom; the Monitor and the next point carry on."""
    import torch

    from probes.instruments.ledger import Ledger
    from probes.monitor.monitor import Monitor
    from trainer.fitmeter import PointMeter

    def probe_three() -> list[dict]:
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 1))
        opt = torch.optim.AdamW(model.parameters())
        ledger = Ledger(every=10**12, min_gap_s=float("inf"))
        mon = Monitor(model, opt, run_dir=tmp_path / "runs", warmup_steps=0, listen=False,
                      profiler=False, leak_watch=False, ledger=False, extra_hooks=[ledger],
                      write_report=False)
        meter = PointMeter(mon, ledger, opt)

        def step(b: int, fail: bool = False):
            def run(s):
                out = model(torch.randn(b, 8))
                loss = out.pow(2).mean()
                loss.backward()
                if fail:
                    torch.empty(1 << 60, dtype=torch.uint8)  # the allocator says no
                opt.step()
                opt.zero_grad(set_to_none=True)
                s.set(loss=loss, output=out)
            return run

        points = [meter.measure(8, 1, step(8)), meter.measure(64, 1, step(64, fail=True)),
                  meter.measure(16, 1, step(16))]
        mon.close()
        return points

    ok, failed, after = in_thread(probe_three)
    assert ok["status"] == OK and after["status"] == OK
    assert failed["status"] == OOM and "allocate" in failed["reason"]
    assert "parts" not in failed


def test_a_budget_below_the_model_is_refused_before_any_point(tiny_config, tmp_path):
    probe, run_dir, _ = _probe(tiny_config, tmp_path, [(1, 16), (2, 16)],
                               budget_bytes=1024)
    assert probe.points == [] and "below the model's own size" in probe.refused
    assert "× 16 B" in probe.refused


def test_the_guard_lets_a_warm_up_steps_growth_pass_and_still_stops_a_leak():
    from probes.counters.memory import MemoryReading
    from probes.monitor.guard import MemoryGuard

    def reading(rss_mib: float) -> MemoryReading:
        return MemoryReading(None, None, None, int(rss_mib * MIB))

    stops: list[str] = []
    guard = MemoryGuard(400 * MIB, "cpu", lambda *a: None, stops.append, warmup_steps=2)
    assert not guard.check(0, reading(100))
    assert not guard.check(1, reading(300), 1.0)  # +200 MiB once: set-up, not a rate
    assert not guard.check(2, reading(310), 2.0)
    assert guard.check(3, reading(390), 3.0)  # +80 MiB a step after warm-up: 470 > 400
    assert "would pass --max-memory" in stops[-1]
    old = MemoryGuard(400 * MIB, "cpu", lambda *a: None, stops.append)  # no warm-up: as before
    old.check(0, reading(100))
    assert old.check(1, reading(300), 1.0)
    over = MemoryGuard(400 * MIB, "cpu", lambda *a: None, stops.append, warmup_steps=5)
    over.check(0, reading(100))
    assert over.check(1, reading(450), 1.0)  # over already: stopped, whatever the warm-up
    assert "is over --max-memory" in stops[-1]


def _ledger(**kw) -> dict:
    return {"device": "cpu", "sampled_step": 6, "batch_size": 16, "seq_len": 128,
            "rest": {"allocated": 137 * MIB, "reserved": 273 * MIB, "rss": 561 * MIB},
            "allocated_bytes": 221 * MIB, "attention_scores_bytes": 16 * MIB,
            "budget_bytes": 700 * MIB, "budget_source": "--max-memory", "max_seq_len": 256,
            **kw}


def test_the_live_line_scales_one_measured_size():
    led = _ledger()
    base = (561 - 273 + 137) * MIB
    rows = [{"step": s, "device": "cpu", "host_rss_bytes": (557 + s % 3) * MIB}
            for s in range(1, 31)]
    rows.append({"step": 30, "device": "cpu", "host_rss_bytes": 900 * MIB,
                 "disturbed": "traced"})  # a profiler window's step: left out
    peaks = LivePeaks()
    assert peaks.line() is None
    peaks.new_ledger(led)
    assert peaks.add(rows)
    assert min(peaks.values) == 557 * MIB and max(peaks.values) == 559 * MIB
    live = live_fit(led, peaks.values)
    step = 558 * MIB - base  # the rows' median
    assert live["base_bytes"] == base and live["step_bytes"] == step
    limit = 700 * MIB * 0.9
    b = live["largest_batch"]
    assert base + step * b / 16 <= limit < base + step * (b + 1) / 16
    q = 16 / (221 - 137)  # the T×T share of the forward's growth
    t = live["largest_seq"]

    def at_t(x: float) -> float:
        return base + step * ((1 - q) * x / 128 + q * (x / 128) ** 2)

    assert at_t(t) <= limit < at_t(t + 1)
    assert live["band"] == pytest.approx(2 / 558)
    assert live_line(live) == f"fits B ≤ {b}, T ≤ {t} on this device (±0.4%)"
    capped = live_fit(_ledger(max_seq_len=150), peaks.values)
    assert capped["largest_seq"] == 150 and "(the context)" in live_line(capped)
    ranks = live_fit(_ledger(world_size=2), peaks.values)
    assert "per rank" in live_line(ranks)
    assert live_fit(_ledger(rest=None), peaks.values) is None  # a ledger from before
    assert live_fit(led, peaks.values[:2]) is None  # not steady yet


def test_the_ledger_pane_shows_the_live_line():
    from tui.widgets.ledger import ledger_table_text

    led = dict(_ledger(), lines=[{"name": "parameters", "measured_bytes": MIB}])
    text = ledger_table_text(led, 100, "fits B ≤ 23, T ≤ 128 on this device (±3.7%)")
    assert text.splitlines()[-1] == "fits B ≤ 23, T ≤ 128 on this device (±3.7%)"


def test_a_guard_stop_mid_point_is_said_with_what_was_measured(tiny_config, tmp_path):
    """The verification run's way (trainer/fitprobe.py main): the budget as --max-memory, a
    point over it stopped by the guard, not by the kernel."""
    from probes.counters.host import RssReader
    from probes.counters.memory import trim_heap

    trim_heap()  # a worker that ran other tests holds free heap its steps would reuse
    rss = RssReader()
    limit = rss.read() + 1 * MIB  # below what the probe's steps add
    rss.close()
    probe, _, _ = _probe(tiny_config, tmp_path, [(256, 32)], refine=False,
                         config={"max_memory_bytes": limit, "warmup_steps": 2})
    assert probe.points and probe.points[0]["status"] == GUARD
    assert probe.exit_code == 3 and "memory guard" in probe.points[0]["reason"]


def test_any_monitor_loop_gets_the_live_line_against_its_max_memory(tmp_path):
    """probes.Monitor on a model that is not memtop's GPT: the ledger's event carries the
    batch (the output handed to step.set), the level between steps and --max-memory as the
    budget, so the line is computed from its rows (the report's ledger section shows it)."""
    import torch

    from probes.analysis.report.build import build_report
    from probes.monitor.monitor import Monitor
    from probes.runfolder import read_rows

    limit = 8 * 1024 * MIB

    def loop() -> object:
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 8))
        opt = torch.optim.AdamW(model.parameters())
        with Monitor(model, opt, run_dir=tmp_path, warmup_steps=2, max_memory_bytes=limit,
                     listen=False, profiler=False, leak_watch=False) as mon:
            for _ in range(12):
                with mon.step() as s:
                    out = model(torch.randn(32, 64))
                    loss = out.pow(2).mean()
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    s.set(loss=loss, output=out)
        return mon.run_dir

    run_dir = in_thread(loop)
    rows = read_rows(run_dir / "metrics.jsonl")
    ledger = [e for e in rows.events if e["event"] == "ledger"][-1]
    assert ledger["batch_dim"] == 32 and ledger["seq_len"] is None
    assert ledger["budget_bytes"] == limit and ledger["budget_source"] == "--max-memory"
    assert set(ledger["rest"]) == {"allocated", "reserved", "rss"}
    section = build_report(run_dir)
    line = section["live_fit"]["line"]
    assert line is not None and line.startswith("fits B ≤ ") and "on this device" in line
    assert section["live_fit"]["largest_batch"] > 32


async def test_the_dashboards_ledger_pane_gains_the_live_line_as_rows_arrive(make_app):
    """The ledger event, then steady rows: the pane recomputes its last line from them (the
    UI thread, from the ring), never on the training thread."""
    from factories import make_sample, wait_for

    from probes.records import Event

    app = make_app(autostart=False)
    async with app.run_test(size=(120, 40)) as pilot:
        app.ring.push(Event("ledger", 6, 1.0, dict(_ledger(), lines=[
            {"name": "parameters", "measured_bytes": MIB, "predicted_bytes": MIB,
             "formula": "P × 4 B", "note": ""}], reserved_bytes=300 * MIB)))
        await wait_for(pilot, lambda: app.ledger.data is not None, "the ledger pane")
        assert "fits B" not in app.ledger.text  # not steady yet: no rows after it
        for step in range(6, 12):
            app.ring.push(make_sample(step, host_rss_bytes=558 * MIB))
        await wait_for(pilot, lambda: "fits B ≤ " in app.ledger.text, "the live line")
        assert app.ledger.live == live_line(live_fit(_ledger(), [558 * MIB] * 6))


def test_a_budget_below_what_the_process_holds_is_refused_by_trains_rule(tiny_config,
                                                                        tmp_path):
    """Above the model's own size, below the RSS of the process with torch and the model:
    refused before a point runs (`memtop train --max-memory`'s rule), not measured over."""
    probe, _, _ = _probe(tiny_config, tmp_path, [(1, 16), (2, 16)], budget_bytes=64 * MIB)
    assert probe.points == [] and "already holds (RSS" in probe.refused
    assert probe.held_bytes > 64 * MIB


def test_a_probe_run_folder_says_it_is_a_probe_not_one_shape(tiny_config, tmp_path):
    """config.json says mode "fit"; the report shows the points it ran, no one B/T, no step
    timing or finding mixed across shapes; the header no B/T."""
    import json

    from probes.analysis.report.build import write_report
    from tui.status_bars import header_shape

    grid = probe_grid(4, 16, "batch")
    probe, run_dir, _ = _probe(tiny_config, tmp_path, grid, refine=False)
    assert [p.get("role") for p in probe.points] == ["probe"] * 3
    config = json.loads((run_dir / "config.json").read_text())
    assert config["mode"] == "fit"
    assert header_shape(config, {}) == (None, None, "fit probe")
    md = write_report(run_dir).read_text()
    assert "probe points B×T: 1×16, 2×16, 4×16;" in md
    input_row = next(line for line in md.splitlines() if line.startswith("| input "))
    assert "tokens/step" not in md and "B=" not in input_row
    for section in ("## Results", "## Where the step went", "## Finding"):
        assert section not in md
    assert header_shape({"batch_size": 4, "seq_len": 16}, {}) == (4, 16, None)


def test_the_live_line_says_when_todays_size_is_over_the_headroom_line():
    rows = [{"step": s, "device": "cpu", "host_rss_bytes": 558 * MIB} for s in range(6, 12)]
    live = live_fit(_ledger(budget_bytes=600 * MIB), [r["host_rss_bytes"] for r in rows])
    assert live["largest_batch"] < 16 and live["today_over"]
    assert live_line(live).endswith("; B=16 T=128 is over the 10% headroom")
    roomy = live_fit(_ledger(), [558 * MIB] * 6)
    assert not roomy["today_over"] and "headroom" not in live_line(roomy)


def test_a_verify_run_the_guard_stopped_after_its_last_step_is_a_guard_stop(tmp_path):
    """The guard tripped at the end of the run's last measured step (its peak over the
    budget): the point is the guard's, with its counter, as the screen says."""
    from probes import records as R
    from probes.runfolder import RunRecorder
    from tui.fit_run import _child_point

    rec = RunRecorder(tmp_path, config={"mode": "fit"})
    rec.emit(R.FIT_POINT, 5, {"batch_size": 32, "seq_len": 128, "status": "over budget",
                              "reason": "its peak 706 MiB is over the budget 700 MiB",
                              "peak_bytes": 740 * MIB})
    rec.emit(R.MEMORY_GUARD, 5, {"counter": "host RSS", "watched_bytes": 706 * MIB,
                                 "limit_bytes": 700 * MIB, "growth_bytes_per_step": MIB,
                                 "passed": True})
    rec.emit(R.RUN_FINISHED, 5, {"reason": "memory guard: host RSS at 706 MiB passed "
                                           "--max-memory 700 MiB this step"})
    rec.close()
    point = _child_point(tmp_path)
    assert point["status"] == GUARD and point["guard_counter"] == "host RSS"
    assert point["peak_bytes"] == 740 * MIB and "memory guard" in point["reason"]
