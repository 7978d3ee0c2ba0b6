"""The dashboard's layout at each size: panes, chart, leak banner and top-ops table fit and keep
what they must show (App.run_test + Pilot over a tiny real trainer)."""

from __future__ import annotations

import pytest
from factories import TOP_OPS, make_sample, wait_for
from textual.widgets import DataTable

from probes.records import Event
from tests.unit.test_culprit_box import TENSORS
from tui.widgets.memory_chart import REF_CELLS


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)])
async def test_layout_fits_small_and_large_terminals(make_app, size):
    app = make_app(autostart=False)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.status_line.region.height > 0, "the first layout")
        width, height = size
        for widget in (app.header_bar, app.status_line, *app.panes.values()):
            region = widget.region
            assert region.width > 0 and region.height > 0, widget
            assert region.right <= width and region.bottom <= height, widget
        assert app.query_one("#chart-box").region.height >= 6
        assert app.header_bar.region.y == 0
        assert app.status_line.region.bottom == height - 1  # the footer below it
        # What grows with the screen is bounded: chart rebuilds per second fall as its canvas
        # grows past 120x40's, Sparklines hold no more points than they are wide.
        chart = app.chart
        cells = chart.size.width * chart.size.height
        assert chart.interval_s() * min(cells, REF_CELLS) == pytest.approx(
            chart.every_s * cells)
        for pane in app.panes.values():
            pane.push([1.0] * 500)
            pane.refresh_view()
            assert len(pane.points) <= max(1, pane.size.width)
            # what the pane draws (tui/widgets/line_pane.py) is its text and a full bar row
            assert pane.render_line(0).text.rstrip() == pane.top_text.rstrip()
            assert pane.render_line(1).text.rstrip() == pane.range_line.rstrip()
            bars = pane.render_line(2)
            assert bars.cell_length == pane.size.width and set(bars.text) == {"▁"}


async def test_chart_rebuilds_off_the_event_loop_and_at_once_for_a_screenshot(make_app):
    app = make_app(autostart=False)
    async with app.run_test(size=(120, 40)) as pilot:
        chart = app.chart
        await wait_for(pilot, lambda: chart.builds >= 1, "the first (empty) figure")
        first = chart.render()
        builds, threaded = chart.builds, chart.threaded_builds
        chart.add_points([make_sample(i, allocated_bytes=2**20 * i, reserved_bytes=2**21 * i)
                          for i in range(1, 50)])
        assert chart.maybe_redraw(None)
        assert chart.render() is first  # the old figure stays up while the thread builds
        await wait_for(pilot, lambda: chart.builds >= 2, "the figure built on a thread")
        # every build since ran on the chart's thread (once per size the layout had)
        assert chart.threaded_builds - threaded == chart.builds - builds > 0
        assert chart.render() is not first and "step" in chart.render().plain
        chart.add_points([make_sample(60, allocated_bytes=1, reserved_bytes=2)])
        builds, threaded = chart.builds, chart.threaded_builds
        assert chart.maybe_redraw(None, force=True)
        chart.render()
        assert chart.builds == builds + 1 and chart.threaded_builds == threaded  # on the loop
        chart.add_points([make_sample(61, allocated_bytes=1, reserved_bytes=2)])
        app.redraw_chart()  # the box says which steps the figure holds and how stale it may be
        title = str(app.query_one("#chart-box").border_title)
        assert title.startswith("memory, steps 1–61 · redrawn every ") and title.endswith(" s")


def test_chart_ticks_are_whole_steps():
    from tui.widgets.memory_chart import step_ticks

    assert step_ticks(1, 3) == [1, 2, 3]  # plotext alone put "1.50" between them
    assert step_ticks(5, 5) == [5]
    assert step_ticks(12, 840) == [200, 400, 600, 800]
    assert step_ticks(0, 99) == [0, 20, 40, 60, 80]
    for first, last in ((1, 2), (3, 17), (100, 100_000)):
        ticks = step_ticks(first, last)
        assert 1 <= len(ticks) <= 5 and all(first <= t <= last for t in ticks)


def test_chart_title_says_its_steps_and_its_redraw_interval():
    from tui.widgets.memory_chart import chart_title

    assert chart_title(None, None, 5.0) == "memory over recent steps"
    assert chart_title(1200, 14030, 5.0) == "memory, steps 1,200–14,030 · redrawn every 5 s"


@pytest.mark.parametrize("size", [(80, 24), (100, 30), (120, 40)])
async def test_leak_banner_follows_the_forecast_and_marks_a_cut(make_app, size):
    """The ETA follows leak_forecast events (not frozen at the alert); a text longer than the
    banner's lines ends with "…"; LEAK CLEARED says when RSS stays up that glibc keeps it, and
    the culprit box of that leak goes."""
    app = make_app(autostart=False)
    async with app.run_test(size=size) as pilot:
        alert = {"counter": "host_heap", "bytes_per_step": 153600, "since_step": 41,
                 "fill_counter": "host RSS", "limit_name": "--max-memory",
                 "capacity_bytes": 600 * 1024**2, "fill_bytes_per_step": 2 * 1024**2,
                 "steps_to_full": 300, "seconds_to_full": 600.0, "host_rss_bytes": 900 << 20,
                 "hint": "a retained autograd graph, likely: " + "many small objects " * 30}
        app.ring.push(Event("leak_suspected", 60, 3.0, alert))
        await wait_for(pilot, lambda: app.leak_banner.shown, "leak banner")
        assert "10 min" in app.leak_banner.text
        lines = app.leak_banner.text.split("\n")
        assert len(lines) <= 4 and lines[-1].endswith("…")
        assert all(len(ln) <= size[0] - 2 for ln in lines)
        app.ring.push(Event("leak_forecast", 90, 6.0, {
            "counter": "host_heap", "fill_counter": "host RSS", "limit_name": "--max-memory",
            "capacity_bytes": 200 * 1024**2, "fill_bytes_per_step": 4 * 1024**2,
            "steps_to_full": 50, "seconds_to_full": 75.0}))
        await wait_for(pilot, lambda: "75 s" in app.leak_banner.text, "recomputed ETA")
        app.ring.push(Event("leak_culprit", 95, 6.5, {"steps": 3, "culprits": [], "guess": "x"}))
        await wait_for(pilot, lambda: app.culprit_box.has_class("-shown"), "the culprit box")
        app.ring.push(Event("leak_cleared", 120, 8.0, {
            "counter": "host_heap", "since_step": 110, "host_rss_bytes": 1600 << 20,
            "alert_rss_bytes": 900 << 20}))
        await wait_for(pilot, lambda: "CLEARED" in app.leak_banner.text, "leak cleared")
        assert "glibc keeps freed memory" in app.leak_banner.text.replace("\n", " ")
        assert not app.culprit_box.has_class("-shown")  # what held memory then: in the report


@pytest.mark.parametrize("size", [(80, 24), (100, 30), (120, 40)])
async def test_top_op_names_keep_their_room_at_every_size(make_app, size):
    """issue 30: at 100 columns names were cut to 12 cells (`aten::ma…dices`) to fit every
    numeric column; now columns give way (the sort column never) and the title says so."""
    from tui.format_panels import OP_NAME_MIN

    ops = [dict(TOP_OPS[0], name="aten::max_pool2d_with_indices", cpu_memory_bytes=4096.0),
           *TOP_OPS[1:]]
    app = make_app()
    async with app.run_test(size=size) as pilot:
        app.ring.push(Event("profile_done", 9, 1.0, {
            "dir": "profiles/step-5", "sort_by": "cpu", "top_ops": ops, "analysis_s": 0.4}))
        await wait_for(pilot, lambda: app.ops_table.ops, "top-ops table")
        if size[0] < 100 and app.view != "ops":  # from 100 columns top ops is always shown
            await pilot.press("v")
        await wait_for(pilot, lambda: app.ops_table.size.width > 0, "the table on screen")
        table = app.ops_table.query_one(DataTable)
        names = [str(table.get_cell_at((r, 0))) for r in range(table.row_count)]
        name_w = next(iter(table.columns.values())).width
        assert name_w >= OP_NAME_MIN and all(len(n) <= name_w for n in names), (name_w, names)
        assert any(n.startswith("aten::max_pool") for n in names)
        assert all(n == full or n.endswith(full[-3:]) and "…" in n
                   for n, full in zip(names, app.ops_table.row_names, strict=True))
        shown = len(table.columns) - 1
        if shown < len(app.ops_table.columns):
            assert f"+{len(app.ops_table.columns) - shown} col" in app.ops_table.border_title
        await pilot.press("q")


LEDGER_LINES = ["parameters", "gradients", "optimizer state", "autocast weight copies",
                "saved activations", "runtime heap at start", "other / temporaries",
                "malloc free"]


@pytest.mark.parametrize("size", [(100, 30), (120, 40)])
async def test_top_ops_and_ledger_share_a_short_side_column(make_app, size):
    """A new user at 100×30 with a leak banner and a culprit box up: the ledger took the whole
    side column, top ops kept no row and the ledger lost its bottom border. Now top ops keeps
    its placeholder's lines and the ledger its border; on a tall column the ledger gets all
    its lines and no more, the rest goes to top ops."""
    app = make_app(autostart=False)
    async with app.run_test(size=size) as pilot:
        app.ring.push(Event("ledger", 40, 2.0, {
            "lines": [{"name": name, "measured_bytes": 3 * 1024**2, "predicted_bytes": None,
                       "formula": "", "note": ""} for name in LEDGER_LINES],
            "total_measured_bytes": 3 * 1024**2, "allocated_bytes": 100 * 1024**2,
            "reserved_bytes": 120 * 1024**2, "sampled_step": 40}))
        app.ring.push(Event("leak_suspected", 60, 3.0, {
            "counter": "host_heap", "bytes_per_step": 153600, "since_step": 41,
            "hint": "a retained autograd graph, likely: " + "many small objects " * 30}))
        app.ring.push(Event("leak_culprit", 62, 3.2, {"steps": 3, "culprits": [TENSORS] * 3}))
        await wait_for(pilot, lambda: app.culprit_box.has_class("-shown")
                       and app.ledger.data is not None, "banner, culprit box and ledger")
        await pilot.pause()
        side, ops, ledger = (app.query_one("#side").region, app.ops_table.region,
                             app.ledger.region)
        assert ops.height >= 4 and ops.bottom == ledger.y
        assert ledger.bottom <= side.bottom  # its bottom border is on screen
        border_row = app.screen.get_widget_at(ledger.x, ledger.bottom - 1)[0]
        assert border_row is app.ledger
        lines = app.ledger.text.count("\n") + 1
        if size == (120, 40):  # room for every line: all of them, and top ops has the rest
            assert ledger.height == lines + 2 and ops.height == side.height - ledger.height
        else:
            assert ledger.height < lines + 2
            assert app.ledger.max_scroll_y > 0  # a scrollbar says the rest is there
        # and no line wraps beside it: each line left the scrollbar its column ("2 × P ×"
        # over "4…" in the README's picture)
        assert max(len(line) for line in app.ledger.text.splitlines()) \
            <= app.ledger.content_region.width - 3


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_a_leak_open_at_the_runs_end_says_so_and_offers_no_w(make_app, size):
    """A finished run's banner went on projecting and pointing at `w`, which it no longer
    offers."""
    app = make_app(autostart=False)
    async with app.run_test(size=size) as pilot:
        app.ring.push(Event("leak_suspected", 60, 3.0, {
            "counter": "host_heap", "bytes_per_step": 153600, "since_step": 41,
            "hint": "a retained autograd graph, likely"}))
        await wait_for(pilot, lambda: "w names the holder" in app.leak_banner.text, "banner")
        app.ring.push(Event("run_finished", 70, 4.0, {"reason": "stopped by user"}))
        await wait_for(pilot, lambda: "at the end" in app.leak_banner.text
                       or "at the run's end" in app.leak_banner.text, "the ended banner")
        assert "w names" not in app.leak_banner.text and "w" not in app.active_bindings
