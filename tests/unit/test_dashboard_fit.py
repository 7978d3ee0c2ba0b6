"""Issue 30, item 13's screen leftovers, by Pilot at 80×24 and 120×40: toasts leave the status
line visible, the header clock holds while paused, the footer cuts no key label unmarked (v at
100+ columns: test_step_split_pane.py; top ops' rank under --nproc 2: integration/test_ranks.py).

Waits poll a condition with a generous deadline (the machine is shared); nothing asserts a time.
"""

from __future__ import annotations

import re

import pytest
from factories import wait_for
from textual.widgets._footer import FooterKey
from textual.widgets._toast import Toast

from tui.widgets.footer import MemtopFooter

SIZES = [(80, 24), (120, 40)]


@pytest.mark.parametrize("size", SIZES)
async def test_toasts_stack_above_the_status_line(make_app, size):
    app = make_app(autostart=False)
    async with app.run_test(size=size, notifications=True) as pilot:  # run_test hides toasts
        app.status_line.show("finished at step 30")
        for i in range(3):  # a stack of toasts, the rack at its tallest
            app.notify(f"toast number {i} with a message long enough to wrap", timeout=30)
        await wait_for(pilot, lambda: len(list(app.screen.query(Toast))) == 3
                       and all(t.region.height for t in app.screen.query(Toast)), "toasts")
        status = app.status_line.region
        assert status.height == 1 and status.y == size[1] - 2  # just above the footer
        for toast in app.screen.query(Toast):
            assert toast.region.bottom <= status.y, (toast.region, status)


def _clock(header: str) -> str:
    """The header's clock field (`step N │ M:SS │ STATE`)."""
    return next(part.strip() for part in header.split("│") if re.fullmatch(
        r"\d+:\d\d(:\d\d)?", part.strip()))


def footer_words(footer: MemtopFooter) -> list[str]:
    return [key.description for key in footer.query(FooterKey)]


@pytest.mark.parametrize("size", SIZES)
async def test_the_header_clock_holds_while_paused(make_app, size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.last_sample is not None and app.last_sample.step >= 2,
                       "the first steps")
        await pilot.press("space")
        await wait_for(pilot, lambda: "PAUSED" in app.header_bar.text
                       and app.run_state.paused_at is not None, "PAUSED in the header")
        held = _clock(app.header_bar.text)
        # the footer's space says what it will do now
        footer = app.query_one(MemtopFooter)
        await wait_for(pilot, lambda: "resume" in footer_words(footer), "space: resume")
        assert "pause" not in footer_words(footer)
        wall = app.trainer.elapsed_s()
        await wait_for(pilot, lambda: app.trainer.elapsed_s() > wall + 2.5,
                       "the run's wall clock two seconds on")
        await wait_for(pilot, lambda: app.ticks > 0, "a refresh")
        ticks = app.ticks
        await wait_for(pilot, lambda: app.ticks >= ticks + 2, "refreshes while paused")
        assert _clock(app.header_bar.text) == held, app.header_bar.text
        await pilot.press("space")
        await wait_for(pilot, lambda: app.run_state.paused_at is None
                       and "RUNNING" in app.header_bar.text, "resumed")
        await wait_for(pilot, lambda: "pause" in footer_words(footer), "space: pause again")
        # running again: the clock goes on from where it held, the pause left out
        assert app.elapsed_s() < app.trainer.elapsed_s() - 2.0
        await pilot.press("q")


def test_the_run_clock_leaves_pauses_out():
    from probes.records import Event
    from probes.runfolder.state import RunState

    st = RunState()
    st.apply(Event("paused", 5, 10.0, {"source": "keyboard"}))
    assert st.run_clock(12.0) == st.run_clock(30.0) == 10.0  # held while paused
    st.apply(Event("resumed", 5, 40.0, {"source": "keyboard"}))
    assert st.run_clock(41.0) == 11.0  # 30 s paused, left out
    st.apply(Event("paused", 9, 50.0, {}))
    st.apply(Event("resumed", 9, 55.0, {}))
    assert st.run_clock(60.0) == 25.0


def _footer_problems(app) -> list[str]:
    """Keys the footer row cuts or shows past its edge; descriptions not whole nor marked."""
    from textual.widgets._footer import FooterKey

    from tui.app import MemtopApp
    from tui.format import FOOTER_SHORT
    from tui.widgets.footer import MemtopFooter

    footer = app.screen.query_one(MemtopFooter)
    words = {b.description for b in MemtopApp.BINDINGS} | set(FOOTER_SHORT.values())
    problems = []
    for key in footer.query(FooterKey):
        if key.region.right > footer.region.right or key.region.width == 0:
            problems.append(f"{key.key_display} {key.description} past the edge")
        if key.description not in words and not key.description.endswith("…"):
            problems.append(f"{key.key_display} {key.description!r} cut without …")
    return problems


@pytest.mark.parametrize("size", SIZES)
async def test_the_footer_cuts_no_key_label_unmarked(make_app, size):
    from textual.widgets._footer import FooterKey

    def laid_out() -> bool:  # composed and placed (a region is set after the layout pass)
        keys = app.screen.query(FooterKey)
        return len(keys) >= 8 and all(k.region.width > 0 for k in keys)

    app = make_app(autostart=False)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, laid_out, "the footer's keys, laid out")
        assert not _footer_problems(app)
        shown = [k.key_display for k in app.screen.query(FooterKey)]
        assert shown[-1] == "q" and "?" in shown  # quit and help stay on the row
        if size[0] >= 100:
            assert "who holds" in [k.description for k in app.screen.query(FooterKey)]
        await pilot.resize_terminal(60, 24)  # narrower than the short words: cut, marked
        await wait_for(pilot, lambda: any(k.description.endswith("…")
                                          for k in app.screen.query(FooterKey)), "cut keys")
        assert not _footer_problems(app)


async def test_below_80x24_the_screen_says_it_is_too_small_and_the_run_goes_on(make_app):
    """Below 80×24 panes vanished without a word (issue 38): a notice names the size it has
    and needs, the run keeps training and recording, and the notice goes at 80×24."""
    from tui.widgets.too_small import too_small_text

    assert too_small_text(80, 24) is None and too_small_text(120, 40) is None
    assert "79×24, need 80×24" in too_small_text(79, 24)
    app = make_app()
    async with app.run_test(size=(70, 20)) as pilot:
        await wait_for(pilot, lambda: app.last_sample is not None, "the first step")
        assert app.too_small.shown and "70×20, need 80×24" in app.too_small.text
        step = app.trainer.status.step
        await wait_for(pilot, lambda: app.trainer.status.step > step + 2, "training goes on")
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: not app.too_small.shown, "the notice gone at 80×24")
        await pilot.resize_terminal(100, 23)
        await wait_for(pilot, lambda: app.too_small.shown, "the notice back at 23 rows")
        assert "100×23" in app.too_small.text
