"""The help screen (`?`), driven by Textual's Pilot over a real (tiny) CPU trainer thread: the
NVML poll rate it states, opening and closing, built once with nothing left behind."""

from __future__ import annotations

import inspect

from factories import wait_for

from probes.counters.nvml import NvmlPoller
from tui.widgets.footer import MemtopFooter
from tui.widgets.help_screen import HelpScreen, counter_paragraphs

CUDA_COUNTERS = counter_paragraphs("cuda")  # the help's counter section on CUDA


def test_help_states_the_nvml_poll_rate_the_poller_uses():
    interval = inspect.signature(NvmlPoller).parameters["interval_s"].default
    assert f"every {interval:g} s" in " ".join(CUDA_COUNTERS)


async def test_help_screen_opens_and_closes(make_app):
    app = make_app(autostart=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "help screen")
        text = " ".join(str(s.render()) for s in app.screen.query("Static"))
        for words in ("heap used", "heap held", "RSS", "empty_cache", "nvidia-smi",
                      "sampled"):
            assert words in text, words
        from probes.records import HINTS

        for hint in HINTS:  # every live hint is listed, the CUDA-only ones marked on CPU
            assert hint.title in text, hint.name
        assert "(CUDA only)" in text
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen), "help closed")


async def test_help_is_built_once_and_screen_changes_leave_nothing_behind(make_app):
    """Re-opening help re-pushes the same screen; the Footer keeps its keys (Textual's made ~10
    new FooterKeys per close: cyclic garbage for gen-2 passes on the UI thread) and no watchers
    of removed keys (Textual #6666 kept ~9 FooterKeys per screen change)."""
    app = make_app(autostart=False)
    async with app.run_test(size=(80, 24)) as pilot:
        footer = app.query_one(MemtopFooter)
        await wait_for(pilot, lambda: len(footer.query("FooterKey")) >= 8, "the footer's keys")
        screens, watchers, keys = [], [], []
        for _ in range(4):
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "help screen")
            screens.append(app.screen)
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen), "closed")
            await pilot.pause()
            watchers.append(footer.compact_watchers())
            keys.append(list(footer.query("FooterKey")))
        assert all(s is screens[0] for s in screens)
        assert all(k == keys[0] for k in keys[1:])  # the same widgets: not recomposed
        assert watchers[-1] <= watchers[0], watchers  # unpatched Footer: +9 per open/close
        assert watchers[0] <= len(footer.query("FooterKey"))
