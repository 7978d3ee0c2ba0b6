"""Issue 30, item 13's screen leftovers, by Pilot at 80×24 and 120×40: toasts leave the status
line visible, the header clock holds while paused, the footer cuts no key label unmarked, and
top ops say whose window they show beside another rank's panes.

Waits poll a condition with a generous deadline (the machine is shared); nothing asserts a time.
"""

from __future__ import annotations

import pytest
from factories import wait_for
from textual.widgets._toast import Toast

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
