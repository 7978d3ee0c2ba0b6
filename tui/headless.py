"""``memtop train --headless``: the same run, with one compact line every few steps."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

from probes import records as R
from probes.analysis.step_split import split_line
from probes.control.requests import RunControl
from probes.records import Event, Record, StepSample
from probes.tools.units import format_bytes, format_rate
from trainer.config import TrainConfig
from trainer.exit_codes import EXIT_FAILED, EXIT_SIGHUP, EXIT_SIGINT, EXIT_SIGTERM
from tui.output import quiet_stdout
from tui.panes import throughput, throughput_label


def format_step_line(s: StepSample) -> str:
    """Two lines for a logged step, each ≤ 80 columns (pure; tested without a run): time and
    training, then the four memory counters by their one name (probes/records/names.py).
    The GradScaler's scale and skipped steps only where a scaler runs (fp16 on CUDA). A
    profiler window's or leak demo's steps carry no tag: the `== profile_started` /
    `leak_demo_started` lines around them say so (a tag pushed lines past 80 columns)."""
    loss = "n/a" if s.loss is None else ("nan" if s.loss != s.loss else f"{s.loss:.4f}")
    dev = s.device
    memory = "  ".join(f"{R.counter_name(pane, dev)} {format_bytes(value)}" for pane, value in (
        ("allocated", s.allocated_bytes), ("reserved", s.reserved_bytes),
        ("peak", s.peak_allocated_bytes), ("driver", s.driver_used_bytes)))
    first = (f"step {s.step:>6}  loss {loss}  {throughput_text(s)}  {s.step_ms:7.1f} ms"
             + (f"  scale {s.scale:.0f}" if s.scale is not None else "")
             + (f"  skipped {s.skipped_steps}" if s.skipped_steps else ""))
    return f"{first}\n  {memory}"


def throughput_text(s: StepSample) -> str:
    """What the throughput pane shows (tui/panes.py): tokens/s when the loop counts tokens,
    else samples/s, else steps/s."""
    return f"{format_rate(throughput(s))} {throughput_label(s, short=True)}"


def format_event_line(e: Event) -> str:
    """`== kind at step N  <the kind's sentence>` (probes/records/events.py defines each kind)."""
    return f"== {e.event} at step {e.step}  {e.summary()}".rstrip()


class HeadlessPrinter:
    def __init__(self, log_every: int, out: TextIO) -> None:
        self.log_every = log_every
        self.out = out
        self.ledger: dict | None = None  # the last ledger: a module table's total checks it

    def __call__(self, record: Record) -> None:
        if isinstance(record, StepSample):
            if record.step % self.log_every == 0 or record.step == 1:
                print(format_step_line(record), file=self.out, flush=True)
                split = split_line(record)  # its phases, on a line of their own (≤ 80 columns)
                if split is not None:
                    print(split, file=self.out, flush=True)
        elif record.kind is not None and record.kind.loud:
            print(format_event_line(record), file=self.out, flush=True)
            if record.event == R.ERROR and record.data.get("traceback"):
                print(record.data["traceback"], file=sys.stderr, flush=True)
            if record.event == R.MEMORY_ATTRIBUTION:  # the table the dashboard shows
                from tui.format_attribution import table_lines

                lines = table_lines(record.data, "activations_bytes", 76, self.ledger)
                print("\n".join("  " + ln for ln in lines), file=self.out, flush=True)
        elif record.event == R.LEDGER:
            self.ledger = record.data


def run_headless(config: TrainConfig, run_dir: Path, log_every: int = 10,
                 out: TextIO | None = None) -> int:
    """Train in a background thread; Ctrl-C / SIGTERM / SIGHUP stop it at a step boundary."""
    out = out or sys.stdout
    print(f"memtop: run folder {run_dir}", file=out, flush=True)  # before torch is imported
    from probes.monitor import default_hooks
    from trainer.loop import Trainer

    control = RunControl()
    trainer = Trainer(config, run_dir, control=control, sinks=[HeadlessPrinter(log_every, out)],
                      hooks=default_hooks(**config.hook_options()))
    return drive(trainer, control, run_dir, out)


def drive(runner: Any, control: RunControl, run_dir: Path, out: TextIO) -> int:
    """Start ``runner`` (a Trainer or an InferenceRunner: start/join/exit_code/sink_errors) on
    its thread and wait; the first Ctrl-C / SIGTERM stops it at a step boundary, a second one
    leaves at once. SIGHUP (the terminal went away: a killed tmux pane, a dropped SSH session)
    stops it the same way, with run_finished "interrupted (terminal lost)", unless the job was
    started to outlive its terminal (nohup: SIGHUP ignored). Writes the report at the end.
    The caller has printed the run folder."""
    from tui.finish import finish_run

    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        if len(received) > 1 and signum != signal.SIGHUP:  # a second Ctrl-C means "now":
            raise KeyboardInterrupt  # every finished row is on disk
        lost = signum == signal.SIGHUP  # the terminal went away: its writes now fail
        control.stop("interrupted (terminal lost)" if lost else
                     f"interrupted ({signal.Signals(signum).name})", urgent=lost)
        with contextlib.suppress(OSError, ValueError):
            print(f"memtop: {signal.Signals(signum).name} received, stopping at the next "
                  "step boundary (again to quit at once)", file=out, flush=True)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
                continue  # nohup: the job is meant to outlive its terminal
            previous[sig] = signal.signal(sig, on_signal)
    try:
        runner.start()
        while not runner.join(timeout=0.2):
            pass
        finish_run(run_dir, out)  # the report, from the rows on disk
    except KeyboardInterrupt:
        with contextlib.suppress(OSError, ValueError):  # the terminal may be gone (SIGHUP)
            print("memtop: interrupted again; metrics.jsonl holds every finished step",
                  file=out, flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if runner.sink_errors or signal.SIGHUP in received:  # e.g. `| head`, a closed terminal:
        quiet_stdout()  # the reader went away, the run carried on (or stopped cleanly)
    if received:
        return {signal.SIGINT: EXIT_SIGINT, signal.SIGHUP: EXIT_SIGHUP}.get(received[0],
                                                                             EXIT_SIGTERM)
    return EXIT_FAILED if runner.exit_code is None else runner.exit_code

