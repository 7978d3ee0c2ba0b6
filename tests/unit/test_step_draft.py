"""The step path builds its row as a StepDraft and freezes it in place (probes/records/step.py):
the result is a StepSample like any other — equal, hashed, written and frozen the same."""

from __future__ import annotations

import dataclasses

import pytest

from probes.records import StepDraft, StepSample, freeze_step
from probes.runfolder import json_line

VALUES = dict(step=4, time_s=0.5, loss=2.25, tokens_per_s=100.0, step_ms=3.5,
              allocated_bytes=10, reserved_bytes=20, peak_allocated_bytes=15,
              driver_used_bytes=None, host_rss_bytes=30, scale=None, skipped_steps=1, amp="off",
              device="cpu", forward_ms=1.0, split_step=4)


def test_a_frozen_draft_is_the_sample_the_class_makes():
    made = StepSample(**VALUES)
    drafted = freeze_step(StepDraft(**VALUES))
    assert type(drafted) is StepSample
    assert drafted == made and hash(drafted) == hash(made) and repr(drafted) == repr(made)
    assert json_line(drafted.to_json()) == json_line(made.to_json())
    assert dataclasses.asdict(drafted) == dataclasses.asdict(made)  # defaults filled alike


def test_a_frozen_draft_cannot_change():
    drafted = freeze_step(StepDraft(**VALUES))
    with pytest.raises(dataclasses.FrozenInstanceError):
        drafted.step = 5  # type: ignore[misc]


def test_the_draft_has_every_field_of_the_sample_in_order():
    assert [(f.name, f.default) for f in dataclasses.fields(StepDraft)] == \
        [(f.name, f.default) for f in dataclasses.fields(StepSample)]
