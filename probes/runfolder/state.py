"""A run's state, folded from its records alone: what the dashboard's header and status line,
`memtop runs` and the trainer's own status show.

Because it needs nothing but records, the same state is had from a trainer in this process, a
metrics.jsonl another process is appending to, or a finished run folder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from probes import records as R
from probes.records import Event, Record, StepSample
from probes.records.disturbed import DisturbedSteps


@dataclass
class ProfileWindow:
    first_step: int
    wait: int
    warmup: int
    active: int

    @property
    def steps(self) -> int:
        return self.wait + self.warmup + self.active

    def phase_text(self, index: int) -> str:
        """The phase of the window's ``index``-th step (0-based): "wait 1/1", "active 2/3"."""
        if index < self.wait:
            return f"wait {index + 1}/{self.wait}"
        if index < self.wait + self.warmup:
            return f"warmup {index - self.wait + 1}/{self.warmup}"
        return f"active {index - self.wait - self.warmup + 1}/{self.active}"


def ended_state(reason: str | None) -> str:
    """The state of a run that ended without an error, from run_finished's reason: finished
    (it ran its steps), interrupted (Ctrl-C, a lost terminal) or stopped (a viewer, the memory
    guard, a full disk). One word for the header, `memtop runs` and the report."""
    reason = reason or ""
    if reason == "finished":
        return "finished"
    if reason.startswith("interrupted"):
        return "interrupted"
    return "stopped"


@dataclass
class RunState:
    """Everything here is derived from records; ``apply`` each one in order."""

    state: str = "starting"  # starting running paused finished stopped interrupted failed
    step: int = 0  # the last step recorded
    time_s: float = 0.0  # the run's clock at the last record
    device: str = ""
    device_name: str = ""
    device_total_bytes: int | None = None
    amp: str = ""
    params: int = 0
    counters: str | None = None  # where allocated/reserved come from, in words
    started: dict[str, Any] | None = None  # the run_started row's data
    last_sample: StepSample | None = None
    profile_phase: str | None = None  # "wait 1/1", "active 2/3", "analysing", None
    profile_done_step: int | None = None  # the step of the last window whose table came
    profile_done_window: str | None = None  # its name by its traced steps ('steps 52–54')
    window: ProfileWindow | None = None
    # a memory attribution window: (first step, warm-up steps, measured steps) while open
    attribution: tuple[int, int, int] | None = None
    attribution_phase: str | None = None  # "warm-up", "measuring 1/1", None
    attribution_done_step: int | None = None  # the step of the last memory_attribution
    leak_active: bool = False
    leak_kind: str | None = None
    leak_since: int | None = None
    alerts: dict[str, dict[str, Any]] = field(default_factory=dict)  # counter -> leak data
    stop_reason: str | None = None
    error: str | None = None
    finished: bool = False
    guard_tripped: bool = False  # --max-memory stopped the run (exit status 3)
    records: int = 0
    paused_s: float = 0.0  # the run's clock spent in pauses already resumed
    paused_at: float | None = None  # the run's clock when the pause in course began
    # which steps memtop's own diagnosis disturbs, fed every event (probes/records/disturbed.py):
    # the session asks it for each row it builds
    disturbed: DisturbedSteps = field(default_factory=DisturbedSteps)

    def run_clock(self, now_s: float) -> float:
        """The header's clock: the run's time ``now_s`` without its pauses, held while one
        lasts (the rows' time_s, the run's wall clock, keep counting through them)."""
        if self.paused_at is not None:
            now_s = min(now_s, self.paused_at)
        return max(0.0, now_s - self.paused_s)

    @property
    def ended(self) -> bool:
        return self.finished

    @property
    def outcome(self) -> str:
        """live | finished | stopped | interrupted | failed: one word for `memtop runs`."""
        if not self.finished:
            return "live" if self.state != "failed" else "failed"
        if self.error is not None or self.state == "failed":
            return "failed"
        return ended_state(self.stop_reason)

    def apply(self, record: Record) -> None:
        self.records += 1
        self.time_s = max(self.time_s, record.time_s or 0.0)
        if isinstance(record, StepSample):
            self._sample(record)
        else:
            self._event(record)

    def _sample(self, s: StepSample) -> None:
        self.step = max(self.step, s.step)
        self.last_sample = s
        if self.amp in ("", "auto") and s.amp:
            self.amp = s.amp  # a Monitor with amp="auto" learns it in the first forward pass
        if self.state == "starting":
            self.state = "running"
        if self.attribution is not None:
            first, warmup, steps = self.attribution
            done = s.step - first + 1  # this step's window steps are over
            self.attribution_phase = (f"warm-up {done + 1}/{warmup}" if done + 1 <= warmup
                                      else f"measuring {min(done + 1 - warmup, steps)}/{steps}")
        if s.profiling and self.window is not None:
            index = s.step - self.window.first_step + 1
            self.profile_phase = (self.window.phase_text(index) if index < self.window.steps
                                  else "analysing")

    def _event(self, e: Event) -> None:
        d = e.data
        name = e.event
        self.disturbed.event(name, e.step, d)
        if name == R.RUN_STARTED:
            self.started = dict(d)
            self.state = "running"
            self.device = str(d.get("device") or "")
            self.device_name = str(d.get("device_name") or self.device)
            self.device_total_bytes = d.get("device_total_bytes")
            self.amp = str(d.get("amp") or "")
            self.params = d.get("params") or 0
            self.counters = d.get("counters")
        elif name == R.PAUSED:
            self.state = "paused"
            if self.paused_at is None:
                self.paused_at = e.time_s or 0.0
        elif name == R.RESUMED:
            if self.state == "paused":
                self.state = "running"
            if self.paused_at is not None:
                self.paused_s += max(0.0, (e.time_s or 0.0) - self.paused_at)
                self.paused_at = None
        elif name == R.PROFILE_STARTED:
            self.window = ProfileWindow(e.step, int(d.get("wait") or 0),
                                        int(d.get("warmup") or 0), int(d.get("active") or 1))
            self.profile_phase = self.window.phase_text(0)
        elif name == R.PROFILE_ANALYSING:
            self.profile_phase = "analysing"
        elif name in (R.PROFILE_DONE, R.PROFILE_CANCELLED):
            self.profile_phase = None
            self.window = None
            self.attribution = None
            self.attribution_phase = None
            if name == R.PROFILE_DONE:
                self.profile_done_step = e.step
                self.profile_done_window = R.window_name(R.window_steps(d), e.step)
        elif name == R.ATTRIBUTION_STARTED:
            warmup, steps = d.get("warmup"), d.get("steps")
            self.attribution = (e.step, warmup if isinstance(warmup, int) else 1,
                                steps if isinstance(steps, int) else 1)
            self.attribution_phase = "warm-up" if self.attribution[1] else "measuring"
        elif name in (R.MEMORY_ATTRIBUTION, R.INFER_ATTRIBUTION, R.ATTRIBUTION_CANCELLED):
            self.attribution = None
            self.attribution_phase = None
            if name != R.ATTRIBUTION_CANCELLED:
                self.attribution_done_step = e.step
        elif name == R.LEAK_DEMO_STARTED:
            self.leak_active = True
            self.leak_kind = d.get("kind")
            self.leak_since = e.step
        elif name == R.LEAK_DEMO_STOPPED:
            self.leak_active = False
            self.leak_since = None
        elif name == R.LEAK_SUSPECTED:
            self.alerts[str(d.get("counter"))] = dict(d, step=e.step)
        elif name == R.LEAK_FORECAST:  # an open alert's time to full, recomputed
            alert = self.alerts.get(str(d.get("counter")))
            if alert is not None:  # a new dict: a reader on another thread keeps the old one
                self.alerts[str(d.get("counter"))] = {**alert, **d}  # None: no forecast now
        elif name == R.LEAK_CLEARED:
            self.alerts.pop(str(d.get("counter")), None)
        elif name == R.ERROR:
            self.error = f"{d.get('error_type', 'Error')}: {d.get('message', '')}"
            self.state = "failed"
            self.stop_reason = self.error
        elif name == R.MEMORY_GUARD:
            self.guard_tripped = True
        elif name == R.RUN_FINISHED:
            self.finished = True
            if self.state != "failed":
                self.stop_reason = str(d.get("reason") or "finished")
                self.state = ended_state(self.stop_reason)
            self.profile_phase = None
            self.window = None
