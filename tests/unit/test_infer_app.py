"""The dashboard over `memtop infer`: the KV cache pane, the two phases, the admission line."""

from __future__ import annotations

import pytest
from factories import run_infer, wait_for

from probes.runfolder import create_run_dir


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_infer_dashboard_shows_the_cache_growing(tmp_path, size):
    from trainer.infer_config import InferConfig, prepare_model
    from tui.app import MemtopApp

    cfg = InferConfig(device="cpu", layers=1, heads=2, dim=32, block_size=64, batch_size=2,
                      prompt_len=8, new_tokens=24, requests=3, baseline_tokens=2,
                      profile_phase="none", run_dir=str(tmp_path / "runs"))
    app = MemtopApp.for_infer(cfg, prepare_model(cfg), create_run_dir(cfg.run_dir),
                              refresh_s=0.1, freeze_gc=False)
    try:
        async with app.run_test(size=size) as pilot:
            kv = app.query_one("#kv")
            await wait_for(pilot, lambda: len(kv.history) >= 10, "KV cache samples")
            await wait_for(pilot, lambda: "predicted" in kv.text[0] or "pred" in kv.text[0],
                           "the KV line")
            assert "+0.0%" in kv.text[0]  # measured storages = the formula
            assert kv.history[-1] >= kv.history[0]
            await wait_for(pilot, lambda: "32-token" in app.admission.text,
                           "the admission line")
            phases = app.query_one("#phases")
            await wait_for(pilot, lambda: "n/a tok/s" not in phases.text[1]
                           and phases.text[1].startswith("decode"), "decode throughput")
            assert phases.text[0].startswith("prefill") and "TTFT" in phases.text[0]
            shape = f"B{cfg.batch_size} T{cfg.prompt_len + cfg.new_tokens}"
            await wait_for(pilot, lambda: shape in app.header_bar.text, "B/T in the header")
            assert f"amp {app.run_state.amp}" in app.header_bar.text
            if size[0] >= 120:  # at 80 the fixed switches give way to the amp mode's reason
                assert "eval·inference_mode·no scaler" in app.header_bar.text
            await wait_for(pilot, lambda: app.run_state.finished, "the run's end")
            assert "none: inference" in app.panes["loss"].range_line
            # no toast per request (they piled over the panes): the phases pane has them
            assert not [n for n in app._notifications if "TTFT" in n.message]
            app.save_screenshot(str(tmp_path / "infer.svg"))
    finally:
        app.shutdown(timeout_s=60)
    assert not app.trainer.alive
    assert (app.run_dir / "report.md").read_text().startswith("# memtop inference report")


async def test_view_of_a_finished_inference_run(tmp_path):
    """`memtop view RUN` on an inference run folder: the same panes, from the files alone."""
    from tui.app import MemtopApp

    code, run_dir, _, _ = run_infer(tmp_path)
    assert code == 0
    app = MemtopApp.for_folder(run_dir, refresh_s=0.1, freeze_gc=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.ticks > 2, "a few refreshes")
        kv = app.query_one("#kv")
        assert len(kv.history) == 16 and "+0.0%" in kv.text[0]
        assert "16-token" in app.admission.text and "limit: " in app.admission.text
        assert app.query_one("#phases").text[1].startswith("decode")


async def test_a_phase_window_shows_ops_not_its_own_label(tmp_path):
    """The decode window's rows are ops: memtop's `decode` label and ProfilerStep* (ranges
    that wrap the steps) are said apart, in the event line, the report and the pane."""
    from probes import records as R
    from probes.analysis.report.build import write_report
    from tui.app import MemtopApp

    code, run_dir, _, events = run_infer(tmp_path, profile_phase="both", new_tokens=8)
    assert code == 0
    done = {e["phase"]: e for e in events if e["event"] == R.PROFILE_DONE}
    raw = [op["name"] for op in done["decode"]["top_ops"]]
    assert "decode" in raw and "ProfilerStep*" in raw  # in the trace's ranking, as ranges
    for phase, e in done.items():
        summary = R.record_from_json(e).summary()
        assert f"top {phase}" not in summary and "top ProfilerStep*" not in summary
        assert "top aten::" in summary
    md = write_report(run_dir).read_text()
    decode_part = md[md.index("### decode"):]
    assert "| decode " not in decode_part and "| ProfilerStep* " not in decode_part
    assert "Left out of the rows: `decode` and `ProfilerStep*`" in decode_part
    assert "memtop's label for the window's steps" in decode_part
    assert "hottest op was aten::" in md
    for size in ((80, 24), (120, 40)):
        app = MemtopApp.for_folder(run_dir, refresh_s=0.1, freeze_gc=False)
        async with app.run_test(size=size) as pilot:
            table = app.ops_table
            await wait_for(pilot, lambda t=table: bool(t.ops), "the last window's rows")
            assert app.ops_table.window["phase"] == "decode"
            names = app.ops_table.row_names
            assert names and not {"decode", "ProfilerStep*"} & set(names)
            subtitle = str(app.ops_table.border_subtitle)
            assert "not ops: decode, ProfilerStep*" in subtitle, subtitle


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_a_shows_which_module_holds_the_cache(tmp_path, size):
    """`a` on `memtop infer`: the next free request's window, its table in the modules pane
    (in the chart's place under 100 columns), `o` sorts by the next column."""
    from trainer.infer_config import InferConfig, prepare_model
    from tui.app import MemtopApp

    cfg = InferConfig(device="cpu", layers=2, heads=2, dim=32, block_size=64, batch_size=2,
                      prompt_len=8, new_tokens=24, requests=500, baseline_tokens=0,
                      profile_phase="none", run_dir=str(tmp_path / "runs"))
    app = MemtopApp.for_infer(cfg, prepare_model(cfg), create_run_dir(cfg.run_dir),
                              refresh_s=0.1, freeze_gc=False)
    try:
        async with app.run_test(size=size) as pilot:
            # requests enough that the key always finds one after it; q ends the run
            await wait_for(pilot, lambda: app.run_state.started is not None, "the run")
            await pilot.press("a")
            table = app.modules_table
            await wait_for(pilot, lambda: table.loaded, "the window's table")
            assert "KV cache" in table.text and "transformer.h.*.attn" in table.text
            assert "per token per sequence" in " ".join(table.text.split())  # wrapped
            assert all(len(ln) <= size[0] for ln in table.text.splitlines())
            assert "modules · request " in str(table.border_title)
            await pilot.press("o")
            assert "by pf peak" in str(table.border_title)
            await pilot.press("q")
            await wait_for(pilot, lambda: app.run_state.finished, "the run's end")
    finally:
        app.shutdown(timeout_s=60)
    assert "Which module holds the memory" in (app.run_dir / "report.md").read_text()
