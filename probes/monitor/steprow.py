"""A run's step row: what RunSession (probes/monitor/session.py) builds from a step's memory
reading, the pollers' latest figures and the writer's own values, one StepSample a step.

Its own module because it is the per-step part of the session (the rest happens once a run or
at a request): the NVML poller's and the workers' sampler's latest readings are copied here,
never read, so the step path does no /proc walk and no NVML call (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from typing import Any

from probes import records as R
from probes.counters.memory import MemoryReading
from probes.counters.workers import ChildChange, WorkersReading
from probes.records import StepDraft, StepSample, freeze_step


class StepRows:
    """Mixed into RunSession; uses its recorder, pollers, rank and device."""

    def step_sample(self: Any, step: int, reading: MemoryReading, step_s: float, *, amp: str,
                    tokens_in_step: int | None = None, samples_in_step: int | None = None,
                    loss: Any = None, scale: float | None = None, skipped_steps: int = 0,
                    **fields: Any) -> StepSample:
        """The step's row from its memory reading, the NVML poller's latest figure (CUDA; the
        process RSS on CPU) and its throughput (the tokens or samples it processed over
        ``step_s``); ``fields`` are the writer's own StepSample fields (grad_norm, profiling,
        phase ...)."""
        return freeze_step(self.step_draft(
            step, reading, step_s, amp=amp, tokens_in_step=tokens_in_step,
            samples_in_step=samples_in_step, loss=loss, scale=scale, skipped_steps=skipped_steps,
            **fields))

    def disturbance(self: Any, step: int, traced: bool = False) -> str | None:
        """Why memtop's own diagnosis disturbed ``step`` (probes/records/disturbed.py), from
        the events published so far; None when it did not. Its row says it (``disturbed``) and
        its high-water mark stays out of the run's peak."""
        return self.recorder.state.disturbed.reason(step, traced)

    def step_draft(self: Any, step: int, reading: MemoryReading, step_s: float, *, amp: str,
                   tokens_in_step: int | None = None, samples_in_step: int | None = None,
                   loss: Any = None, scale: float | None = None, skipped_steps: int = 0,
                   **fields: Any) -> Any:
        """``step_sample``'s row as a StepDraft, still open to the writer's last fields (the
        Monitor's step split) before ``freeze_step`` (probes/records/step.py: why)."""
        if "disturbed" not in fields:  # the writer may have asked first (its peak's read)
            fields["disturbed"] = self.disturbance(step, fields.get("profiling", False))
        driver = reading.host_rss_bytes
        repeats = None  # heap_read_step: the row repeats an earlier step's heap read
        if reading.heap_fresh:
            self._heap_step = step
        else:
            repeats = self._heap_step
        polled: dict[str, Any] = {}
        if self.nvml is not None:
            latest = self.nvml.latest
            driver = latest.driver_bytes if latest is not None else None
            polled = latest.step_fields() if latest is not None else {}
        tree: dict[str, Any] = {}
        self.workers_fresh = None
        if self.workers is not None:  # the sampler's latest reading: no /proc read here
            children = self.workers.latest
            if children is not None:
                tree = children.fields
                if children.seq != self._workers_seq:
                    self._workers_seq = children.seq
                    self.workers_fresh = children
            if self.workers.has_changes:  # a child started or ended: rare
                self.note_workers(step, children)
        return StepDraft(
            step=step, time_s=self.recorder.elapsed_s(), loss=loss,
            tokens_per_s=tokens_in_step / step_s if tokens_in_step else None,
            step_ms=step_s * 1000.0,
            allocated_bytes=reading.allocated_bytes, reserved_bytes=reading.reserved_bytes,
            peak_allocated_bytes=reading.peak_allocated_bytes, driver_used_bytes=driver,
            host_rss_bytes=reading.host_rss_bytes, scale=scale, skipped_steps=skipped_steps,
            amp=amp, device=self._device_text,
            samples_per_s=samples_in_step / step_s if samples_in_step else None,
            rank=self.rank or 0,
            step_peak_allocated_bytes=reading.step_peak_allocated_bytes,
            alloc_retries=reading.alloc_retries, ooms=reading.ooms, heap_read_step=repeats,
            **polled, **tree, **fields)

    def note_workers(self: Any, step: int, reading: WorkersReading | None) -> None:
        """The children that started, ended or were left out since the last row: one
        ``workers`` event, and a ``worker_died`` for each that a signal or an error ended."""
        assert self.workers is not None
        changes = self.workers.take_changes()
        if not changes:
            return
        data: dict[str, Any] = {"started": [], "ended": [], "left_out": []}
        for change in changes:
            data[change.what].append(child_fields(change))
        data = {k: v for k, v in data.items() if v}
        if reading is not None:
            data.update(workers=reading.workers, workers_pss_bytes=reading.pss_bytes,
                        workers_uss_bytes=reading.uss_bytes)
        self.emit(R.WORKERS, step, data)
        for change in changes:
            if change.what == "ended" and change.exit not in (None, "exit 0"):
                self.emit(R.WORKER_DIED, step, child_fields(change))


def child_fields(change: ChildChange) -> dict[str, Any]:
    """A started, ended or left-out child as its event item (probes/records/workers.py)."""
    fields = {"pid": change.pid, "comm": change.comm, "rss_bytes": change.rss_bytes,
              "pss_bytes": change.pss_bytes, "uss_bytes": change.uss_bytes,
              "peak_uss_bytes": change.peak_uss_bytes, "lived_s": change.lived_s,
              "exit": change.exit, "why": change.why}
    return {k: v for k, v in fields.items() if v is not None}
