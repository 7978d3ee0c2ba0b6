"""The run's own words reach the screen as written, never read as markup: op names such as
torch's ``[memory]`` row, a user's ``record_function`` labels, folder names and exception
messages in toasts. Textual reads a str as markup in a DataTable cell, a border title and a
toast: ``[memory]`` vanished there, ``fwd [layer 1]`` lost its label, and ``[/x]`` raised."""

from __future__ import annotations

import pytest
from factories import wait_for
from textual.content import Content
from textual.widgets import DataTable
from textual.widgets._toast import Toast

from probes.records import Event

NAMES = ("[memory]", "fwd [layer 1]", "a[/b] :smile:")
OPS = [{"name": name, "calls": 3 + i, "cpu_time_total_us": 900.0 - 100 * i,
        "self_cpu_time_total_us": 800.0 - 100 * i} for i, name in enumerate(NAMES)]


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_op_names_and_the_tables_titles_show_as_written(make_app, size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        app.ring.push(Event("profile_done", 9, 1.0, {
            "dir": "profiles/[run 1]/step-5", "sort_by": "cpu", "top_ops": OPS,
            "analysis_s": 0.4}))
        await wait_for(pilot, lambda: app.ops_table.ops, "top-ops table")
        if app.view != "ops" and size[0] < 100:
            await pilot.press("v")
        await wait_for(pilot, lambda: app.ops_table.size.width > 0, "the table on screen")
        table = app.ops_table.query_one(DataTable)
        shown = {str(table.get_cell_at((r, 0))) for r in range(table.row_count)}
        assert shown == set(NAMES)
        # the getter gives the title back as markup: read back, it is the text that was set
        subtitle = Content.from_markup(app.ops_table.border_subtitle).plain
        assert subtitle.startswith("profiles/[run 1]/step-5"), subtitle
        assert "top ops" in Content.from_markup(app.ops_table.border_title).plain
        await pilot.press("q")


async def test_a_toast_says_the_runs_words_as_written(make_app):
    app = make_app()
    why = "x[/y] held by cache[key] (see [memory])"
    async with app.run_test(size=(100, 30), notifications=True) as pilot:  # toasts on
        app.ring.push(Event("hint", 4, 1.0, {"title": "input-bound", "why": why}))

        def toast_text() -> str:
            return " ".join(str(t.render()) for t in app.screen.query(Toast))

        await wait_for(pilot, lambda: why in toast_text(), "the hint's toast")
        assert any(n.message == f"input-bound: {why}" for n in app.notices)
        await pilot.press("q")
