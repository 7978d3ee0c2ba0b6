"""``memtop infer --headless``: one line per prefill, one every few decode steps, the events."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from probes import records as R
from probes.control.requests import RunControl
from probes.records import Record, StepSample
from probes.tools.units import format_bytes, format_rate
from tui.headless import drive, format_event_line


def format_infer_line(s: StepSample) -> str:
    """Two lines for an inference step, each ≤ 80 columns (pure; tested without a run): the
    step and its time, then the KV cache against its formula and the counters by their one
    name (probes/records/names.py)."""
    kv, pred = s.kv_cache_bytes, s.kv_cache_predicted_bytes
    off = f" {kv / pred - 1:+.1%}" if kv is not None and pred else ""
    first = (f"{s.phase or '?':<7} req {s.request or '?':>3}  step {s.step:>6}  "
             f"ctx {s.context_tokens or 0:>5}  {s.step_ms:8.2f} ms  "
             f"{format_rate(s.tokens_per_s)} tok/s" + ("  [profiling]" if s.profiling else ""))
    memory = "  ".join(f"{R.counter_name(pane, s.device)} {format_bytes(value)}"
                       for pane, value in (("allocated", s.allocated_bytes),
                                           ("peak", s.peak_allocated_bytes)))
    return f"{first}\n  KV {format_bytes(kv)} (pred {format_bytes(pred)}{off})  {memory}"


class InferPrinter:
    def __init__(self, log_every: int, out: TextIO) -> None:
        self.log_every = log_every
        self.out = out
        self._decode = 0

    def __call__(self, record: Record) -> None:
        if isinstance(record, StepSample):
            show = record.phase == R.PREFILL
            if record.phase == R.DECODE:
                self._decode += 1
                show = self._decode % self.log_every == 0
            if show:
                print(format_infer_line(record), file=self.out, flush=True)
        elif record.kind is not None and record.kind.loud:
            print(format_event_line(record), file=self.out, flush=True)
            if record.event == R.ERROR and record.data.get("traceback"):
                print(record.data["traceback"], file=sys.stderr, flush=True)
            if record.event == R.INFER_ATTRIBUTION:  # the table the dashboard shows
                from tui.format_infer_attribution import SORT_KEYS, table_lines

                lines = table_lines(record.data, SORT_KEYS[0], 76)
                print("\n".join("  " + ln for ln in lines), file=self.out, flush=True)


def run_infer_headless(config: object, spec: object, run_dir: Path, log_every: int = 16,
                       out: TextIO | None = None) -> int:
    out = out or sys.stdout
    print(f"memtop: run folder {run_dir}", file=out, flush=True)
    from trainer.infer import InferenceRunner

    control = RunControl()
    runner = InferenceRunner(config, spec, run_dir, control=control,  # type: ignore[arg-type]
                             sinks=[InferPrinter(log_every, out)])
    return drive(runner, control, run_dir, out)
