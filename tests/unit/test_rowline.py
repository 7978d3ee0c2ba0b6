"""A training row's line from its template (probes/runfolder/rowline.py) reads back as the
encoder's, on random rows of every shape — the other fields byte for byte, durations to 9
significant digits — and falls back to the encoder where it cannot be."""

from __future__ import annotations

import json
import math
import random

import pytest

from probes.records import STEP_FIELDS, StepSample
from probes.runfolder.rowline import DURATION_FIELDS, DURATION_FORMAT, training_line
from probes.runfolder.writer import json_line, step_line

FLOATS = (0.0, -0.0, 1.0, 0.1, 2.5031449981234567, 1e-300, 1.7976931348623157e308, 5e-324,
          1e16, 123456789.123, 65536.0)
INTS = (0, 1, 7, 2**31, 2**63 + 5, 10**30)


def _random_sample(rng: random.Random) -> StepSample:
    values: dict = {}
    for name in STEP_FIELDS:
        if name in ("amp", "device"):
            values[name] = rng.choice(["off", "bf16", "cuda:1", 'q"uo\\te', "50%", "é", "\n"])
        elif name in ("profiling", "leak_active"):
            values[name] = rng.random() < 0.5
        else:
            kind = rng.random()
            if kind < 0.3:
                values[name] = None
            elif kind < 0.6:
                values[name] = rng.choice(INTS) if rng.random() < 0.5 else rng.randrange(10**9)
            else:
                values[name] = rng.choice(FLOATS) if rng.random() < 0.3 else \
                    rng.uniform(-1e6, 1e6) * 10 ** rng.randint(-12, 12)
    return StepSample(**values)


@pytest.mark.parametrize("seed", range(5))
def test_the_template_line_is_the_encoders(seed):
    rng = random.Random(seed)
    for _ in range(400):
        sample = _random_sample(rng)
        values = sample.training_values()
        line = training_line(values)
        assert line is not None
        row = sample.to_json()
        rounded = {name: float(DURATION_FORMAT % v) if type(v) is float else v
                   for name, v in row.items() if name in DURATION_FIELDS}
        assert json.loads(line) == {**row, **rounded}
        assert list(json.loads(line)) == list(row)  # the fields in the encoder's order
        # every field but the rounded durations is the encoder's own text
        encoded = json_line({name: v for name, v in row.items() if name not in rounded})
        assert _without(line, rounded) == encoded


def _without(line: str, names) -> str:
    """``line`` with the fields ``names`` taken out (numbers: their text has no comma; the
    first field, step, keeps its opening quote through the split)."""
    body = [part for part in line[1:-1].split(',"') if part.split('"', 1)[0] not in names]
    return "{" + ',"'.join(body) + "}"


def test_durations_keep_nine_significant_digits():
    assert DURATION_FIELDS == {"time_s", "step_ms", "data_wait_ms", "forward_ms", "backward_ms",
                               "optimizer_ms", "other_ms"}
    sample = StepSample(step=1, time_s=12345.678912345, loss=2.0000000001, tokens_per_s=None,
                        step_ms=2.5031449981234567, allocated_bytes=None, reserved_bytes=None,
                        peak_allocated_bytes=None, driver_used_bytes=None, host_rss_bytes=None,
                        scale=None, skipped_steps=0, amp="off", device="cpu", other_ms=0.0)
    row = json.loads(training_line(sample.training_values()))
    assert row["time_s"] == 12345.6789 and row["step_ms"] == 2.503145
    assert row["other_ms"] == 0 and row["loss"] == 2.0000000001  # not a duration: exact


def test_a_real_row_round_trips():
    row = dict(step=6, time_s=0.794582197, loss=5.308841705322266, tokens_per_s=25567.835676757,
               step_ms=2.503, allocated_bytes=123, reserved_bytes=456, peak_allocated_bytes=200,
               driver_used_bytes=None, host_rss_bytes=9, scale=None, skipped_steps=0, amp="off",
               device="cpu", data_wait_ms=0.0047, split_step=6)
    sample = StepSample(**row)
    assert json.loads(step_line(sample.training_values())) == sample.to_json()


class _Float(float):
    """A float subclass (as numpy's float64 is): its repr may not be a JSON number."""

    def __repr__(self) -> str:
        return "np.float64(1.5)"


@pytest.mark.parametrize("odd", [math.inf, -math.inf, math.nan, _Float(1.5), True])
def test_what_has_no_template_goes_to_the_encoder(odd):
    sample = StepSample(step=3, time_s=1.0, loss=odd, tokens_per_s=None, step_ms=1.0,
                        allocated_bytes=None, reserved_bytes=None, peak_allocated_bytes=None,
                        driver_used_bytes=None, host_rss_bytes=None, scale=None,
                        skipped_steps=0, amp="off", device="cpu")
    values = sample.training_values()
    assert training_line(values) is None
    line = step_line(values)
    assert line == json_line(sample.to_json())
    assert json.loads(line)["loss"] == (None if odd != odd or odd in (math.inf, -math.inf)
                                        else odd)


def test_a_literal_that_reads_like_a_number_goes_to_the_encoder():
    sample = StepSample(step=1, time_s=1.0, loss=1.0, tokens_per_s=None, step_ms=1.0,
                        allocated_bytes=None, reserved_bytes=None, peak_allocated_bytes=None,
                        driver_used_bytes=None, host_rss_bytes=None, scale=None,
                        skipped_steps=0, amp="off", device="infer:0")
    assert training_line(sample.training_values()) is None
    assert json.loads(step_line(sample.training_values()))["device"] == "infer:0"


def test_no_training_field_name_blocks_the_template():
    """A field named like 'inf…' or '…nan…' would send every row to the encoder."""
    assert not [name for name in STEP_FIELDS if "inf" in name or "nan" in name]
