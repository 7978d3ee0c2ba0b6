"""The records a run writes, one definition each: the step row and every kind of event.

    from probes import records as R
    from probes.records import StepSample, Event, record_from_json

    sample = StepSample.from_json(row)      # a metrics.jsonl step row, its values checked
    event = Event.from_json(row)            # an event row, checked against its kind's fields
    R.EVENT_KINDS[R.LEAK_SUSPECTED].summary # the one-line text headless output and the UI show

Records cross threads as frozen dataclasses with units in their field names and are written one
JSON object a line to metrics.jsonl (probes/runfolder/). Each event kind is declared once in
``EVENT_KINDS`` (probes/records/events.py): its fields with their types, whether headless output
prints it, and its summary. The bottom of the layers above tools/: imports nothing but tools/,
never torch (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from probes.records.errors import (  # noqa: F401
    MemtopError,
    MonitorArgumentError,
    MonitorStateError,
    NonFiniteError,
)
from probes.records.events import (  # noqa: F401
    ADMISSION,
    BULKY_FIELDS,
    CACHE_BASELINE,
    CONTROL,
    ERROR,
    EVALUATE,
    EVENT_KINDS,
    HINT,
    LEAK_CLEARED,
    LEAK_CULPRIT,
    LEAK_DEMO_STARTED,
    LEAK_DEMO_STOPPED,
    LEAK_FORECAST,
    LEAK_SUSPECTED,
    LEDGER,
    LEDGER_FAILED,
    MEMORY_GUARD,
    MEMORY_SNAPSHOT,
    METRICS_WRITE_FAILED,
    PAUSED,
    PROFILE_ANALYSING,
    PROFILE_CANCELLED,
    PROFILE_DONE,
    PROFILE_STARTED,
    REPORT_WRITTEN,
    REQUEST_DONE,
    RESUMED,
    RUN_FINISHED,
    RUN_STARTED,
    SAVE,
    WEIGHTS_SAVED,
    Event,
    EventKind,
    Record,
    fill_text,
    incomplete,
    record_from_json,
    switches_text,
)
from probes.records.hints import (  # noqa: F401
    HINT_KINDS,
    HINTS,
    HintKind,
)
from probes.records.names import (  # noqa: F401
    CACHE_LINE,
    COUNTER_NAMES,
    LEDGER_MOMENT,
    PANE_MOMENT,
    counter_name,
)
from probes.records.step import (  # noqa: F401
    DECODE,
    INFERENCE_FIELDS,
    PEAK_RULE,
    PHASES,
    PREFILL,
    STEP_FIELDS,
    StepSample,
    counts_toward_peak,
    step_row_problem,
)
from probes.records.values import (  # noqa: F401
    clean,
    finite_num,
    has_type,
    is_int,
    short_text,
)

__all__ = [
    "MemtopError",
    "MonitorArgumentError",
    "MonitorStateError",
    "NonFiniteError",
    "is_int",
    "PEAK_RULE",
    "CACHE_LINE",
    "COUNTER_NAMES",
    "LEDGER_MOMENT",
    "PANE_MOMENT",
    "counter_name",
    "counts_toward_peak",
    "finite_num",
    "has_type",
    "clean",
    "short_text",
    "StepSample",
    "step_row_problem",
    "INFERENCE_FIELDS",
    "STEP_FIELDS",
    "PREFILL",
    "DECODE",
    "PHASES",
    "Event",
    "Record",
    "BULKY_FIELDS",
    "record_from_json",
    "fill_text",
    "incomplete",
    "EventKind",
    "RUN_STARTED",
    "RUN_FINISHED",
    "ERROR",
    "PAUSED",
    "RESUMED",
    "PROFILE_STARTED",
    "PROFILE_ANALYSING",
    "PROFILE_DONE",
    "PROFILE_CANCELLED",
    "LEAK_SUSPECTED",
    "LEAK_CLEARED",
    "LEAK_CULPRIT",
    "LEAK_FORECAST",
    "LEAK_DEMO_STARTED",
    "LEAK_DEMO_STOPPED",
    "LEDGER",
    "LEDGER_FAILED",
    "MEMORY_GUARD",
    "METRICS_WRITE_FAILED",
    "REPORT_WRITTEN",
    "CONTROL",
    "HINT",
    "MEMORY_SNAPSHOT",
    "WEIGHTS_SAVED",
    "REQUEST_DONE",
    "ADMISSION",
    "CACHE_BASELINE",
    "switches_text",
    "EVENT_KINDS",
    "HintKind",
    "HINTS",
    "HINT_KINDS",
]
