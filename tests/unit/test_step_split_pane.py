"""The step-split pane (issue 26): cycled with `v` at 80×24 and 120×40 over a live run, its
text built by pure functions, and a run older than the split says so."""

from __future__ import annotations

import json

import pytest
from factories import make_sample, wait_for, write_run

from probes.records import SPLIT_FIELDS
from probes.runfolder import METRICS
from tui.app import MemtopApp
from tui.widgets.step_split import (
    BAR_CHARS,
    SPLIT_OFF,
    gpu_busy_text,
    stacked_bar,
    step_split_lines,
)

PHASES = dict(data_wait_ms=10.0, forward_ms=20.0, backward_ms=40.0, optimizer_ms=20.0,
              other_ms=10.0)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_v_cycles_to_the_split_of_a_live_run(make_app, size):
    app = make_app(steps=8)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.last_sample is not None
                       and app.last_sample.step >= 3, "three steps")
        while app.view != "split":
            await pilot.press("v")
        split = app.query_one("#split")
        assert split.display and not app.query_one("#chart-box").display
        await wait_for(pilot, lambda: "backward" in app.step_split.text, "the split's table")
        text = app.step_split.text
        assert "host time" in text and "GPU busy: n/a on CPU" in text
        assert BAR_CHARS["forward_ms"] in text and BAR_CHARS["backward_ms"] in text
        lines = text.splitlines()
        assert all(len(ln) <= split.content_size.width for ln in lines)
        assert len(lines) <= split.content_size.height  # it fits: nothing cut below
        assert any(ln.startswith("█ forward") for ln in lines)
        await pilot.press("v")
        assert app.view == "chart" and app.query_one("#chart-box").display


async def test_a_run_older_than_the_split_says_so(tmp_path):
    run = write_run(tmp_path / "old", steps=5)
    lines = (run / METRICS).read_text().splitlines()
    old = []
    for line in lines:  # the rows as memtop wrote them before issue 26: no phase keys at all
        row = json.loads(line)
        old.append(json.dumps({k: v for k, v in row.items() if k not in SPLIT_FIELDS}))
    (run / METRICS).write_text("\n".join(old) + "\n")
    app = MemtopApp.for_folder(run, refresh_s=0.1, freeze_gc=False)
    async with app.run_test(size=(80, 24)) as pilot:
        while app.view != "split":
            await pilot.press("v")
        await wait_for(pilot, lambda: "predates" in app.step_split.text, "the pane's note")


def test_bar_cells_add_up_and_follow_the_shares():
    bar = stacked_bar(PHASES, 50)
    assert len(bar) == 50 and bar.count(BAR_CHARS["backward_ms"]) == 20
    assert bar.startswith(BAR_CHARS["data_wait_ms"] * 5)
    odd = stacked_bar(dict(PHASES, other_ms=None, data_wait_ms=1.0), 7)
    assert len(odd) == 7 and BAR_CHARS["other_ms"] not in odd
    assert stacked_bar(dict.fromkeys(PHASES), 10) == ""


def test_lines_show_last_median_share_and_why_a_phase_is_missing():
    recent = [make_sample(i, **dict(PHASES, optimizer_ms=None)) for i in range(1, 6)]
    lines = step_split_lines(recent, "cpu", {"step_split": True}, 78, 20)
    assert lines[0] == "step 5, host time"
    row = next(ln for ln in lines if "backward" in ln)
    assert "40.0 ms" in row and "50.0%" in row  # 40 of the 80 ms seen
    assert any(ln.startswith("optimizer: no optimizer step seen") for ln in lines)
    assert all(len(ln) <= 78 for ln in lines)
    assert len(step_split_lines(recent, "cpu", {"step_split": True}, 78, 4)) == 4
    off = step_split_lines(recent, "cpu", {"step_split": False}, 78, 10)
    assert off[0] == SPLIT_OFF
    assert "waiting" in step_split_lines([], "cpu", {}, 78, 10)[0]


def test_gpu_busy_line():
    s = make_sample(3, device="cuda:0", gpu_util_pct=87.0, mem_bw_util_pct=41.0, power_w=212.4,
                    power_limit_w=300.0, sm_clock_mhz=1980.0, temperature_c=71.0)
    assert gpu_busy_text(s, "cuda") == ("GPU busy 87%  mem bw 41%  power 212 W / 300 W  SM "
                                        "1980 MHz  71 °C")
    mig = make_sample(3, device="cuda:0", power_w=90.0)
    assert gpu_busy_text(mig, "cuda").startswith("GPU busy n/a  mem bw n/a  power 90 W")
    assert "MIG" in gpu_busy_text(mig, "cuda")
    assert gpu_busy_text(s, "cpu") == "GPU busy: n/a on CPU"


@pytest.mark.parametrize("size", [(100, 30), (120, 40)])
async def test_v_changes_what_is_shown_at_every_press_when_wide(make_app, size):
    """issue 30: from 100 columns chart, top ops and ledger are side by side, so `v` to "ops"
    or "ledger" changed nothing on screen; each press now shows something else."""
    app = make_app(steps=8)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.last_sample is not None, "a step")
        chart, split = app.query_one("#chart-box"), app.query_one("#split")
        assert chart.display and app.ops_table.display and not split.display
        seen = []
        for _ in range(4):
            before = (chart.display, split.display)
            await pilot.press("v")
            await pilot.pause()
            assert (chart.display, split.display) != before, app.view  # the press showed
            seen.append(app.view)
        assert seen == ["split", "chart", "split", "chart"]
        await pilot.press("q")
