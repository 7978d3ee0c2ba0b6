"""The pane table (tui/panes.py): every pane is declared once, and the grid, the labels, the
values and the help's counter section are all made from it."""

from __future__ import annotations

import math

import pytest
from factories import make_sample

from tui import panes as p
from tui.widgets.help_screen import counter_paragraphs, help_markup

# a CPU run of the Monitor counting samples (no tokens), with a scaler that skipped a step
SAMPLE = make_sample(3, tokens_per_s=None, samples_per_s=12.0, driver_used_bytes=4, scale=8.0,
                     skipped_steps=1, amp="fp16")


def test_ids_are_unique_and_the_grid_holds_every_pane_in_its_rows():
    assert len(set(p.PANE_IDS)) == len(p.PANES)
    columns, rows = p.grid_size()
    assert rows == p.PANE_ROWS and columns == math.ceil(len(p.PANES) / rows)
    assert (columns - 1) * rows < len(p.PANES) <= columns * rows


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_pane_is_explained_in_the_help_under_its_labels(device):
    paragraphs = counter_paragraphs(device)
    for spec in p.PANES:
        on = spec.on(device)
        assert on.label and on.short and on.help, spec.id
        assert len(on.short) <= 9, on.short  # beside a value in a 20-column pane at 80x24
        heading = f"[b]{on.label}[/b]" + (f" ({on.short})" if on.short != on.label else "")
        assert f"{heading}: {on.help}" in paragraphs, spec.id
        if on.note_help:
            assert on.note_help in paragraphs
    assert all(para in help_markup(device, None) for para in paragraphs)


def test_values_labels_and_chart_series_come_from_the_table():
    values = p.sample_values(SAMPLE)
    assert list(values) == list(p.PANE_IDS)
    assert values["tokens"] == 12.0 and values["driver"] == 4 and values["scale"] == 8.0
    tokens = next(spec for spec in p.PANES if spec.id == "tokens")
    assert tokens.sample_label is not None and tokens.sample_label(SAMPLE) == "samples/s"
    assert p.chart_labels("cpu") == ("heap used", "heap held", "heap peak")
    assert p.chart_labels("cuda") == ("allocated", "reserved", "peak")


def test_scale_and_loss_notes_say_why_there_is_none():
    scale = next(spec for spec in p.PANES if spec.id == "scale")
    loss = next(spec for spec in p.PANES if spec.id == "loss")
    assert scale.note is not None and loss.note is not None
    assert scale.note(SAMPLE, {"amp": "fp16"}) == "skipped steps 1"
    assert scale.note(None, {"amp": "bf16"}) == "not needed (bf16)"
    assert scale.note(None, {"amp": "fp16"}) is None  # a scaler runs: its count comes later
    assert scale.note(None, {"amp": "bf16", "mode": "infer"}) == "none: inference"
    assert loss.note(None, {"mode": "infer"}) == "none: inference"
    assert loss.note(SAMPLE, {}) is None


def test_the_loss_pane_holds_a_loss_logged_every_few_steps():
    """HF's loss is on the rows of its logging steps only: the pane keeps the last one over
    the rows without one, but a loss that is there and not finite still shows n/a."""
    loss = next(spec for spec in p.PANES if spec.id == "loss")
    assert loss.holds_last is not None
    assert loss.holds_last(make_sample(loss=None))
    assert not loss.holds_last(make_sample(loss=math.nan))
    assert loss.value(make_sample(loss=math.nan)) is None
    assert all(spec.holds_last is None for spec in p.PANES
               if spec.id not in ("loss", "step_ms", "tokens"))  # those two: disturbed steps


def test_heap_held_above_rss_is_explained_under_the_pane_and_in_the_help():
    """Heap held above RSS read as a wrong counter (issue 38): the note says by how much and
    that it is not resident; the help says why."""
    reserved = next(spec for spec in p.PANES if spec.id == "reserved")
    above = make_sample(5, reserved_bytes=900 * 2**20, allocated_bytes=600 * 2**20,
                        host_rss_bytes=700 * 2**20)
    assert reserved.note(above, {}) == "200 MiB above RSS: not resident"
    below = make_sample(5, reserved_bytes=500 * 2**20, host_rss_bytes=700 * 2**20)
    assert reserved.note(below, {}) is None
    assert any("heap held above RSS" in para and "resident" in para
               for para in counter_paragraphs("cpu"))
    assert not any("heap held above RSS" in para for para in counter_paragraphs("cuda"))
