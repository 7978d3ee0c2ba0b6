"""The dashboard's refresh: what the source gave since the last tick, into the panes.

A 2 Hz timer polls the source and updates only what changed (docs/ARCHITECTURE.md: 2 Hz kept
≥ 0.98 of the headless throughput on 2 cores, 10 Hz full redraws halved it); until the first
sample a faster poll puts it on screen at once. Records are folded into the run state (the same
fold a followed folder and the live trainer feed), samples go to the panes, the chart, the
step split and the `--baseline` watch; events to tui/live_events.py.
"""

from __future__ import annotations

import gc
from typing import Any

from probes.records import Record, StepSample
from tui.panes import PANES, chart_labels, pane_labels, sample_values


class RefreshLoop:
    """Mixed into MemtopApp (tui/app.py); uses its source, run state, panes and chart."""

    def _load_history(self: Any) -> None:
        """A run opened after it started: its past, the chart over the whole run."""
        records, chart = self.source.history()
        if records:
            self.replaying = True  # no toasts for what happened before (tui/live_events.py)
            try:
                self._take(records)
            finally:
                self.replaying = False
        if self.ranks_mode:
            chart = [s for s in chart if s.rank == 0]
        if chart:
            self.chart.points.clear()
            self.chart.add_points(chart)

    def refresh_from_source(self: Any) -> None:
        """Take what the source has since the last tick and redraw what changed."""
        self.ticks += 1
        records = self.source.poll()
        if records:
            self._take(records)
        elif self.source.liveness_due():
            self._ping_worker()  # has the run we follow died without its last row?
        for pane in [*self.panes.values(), *self.infer_panes]:
            pane.refresh_view()
        if self.ranks_mode:
            self.rank_table.refresh_view()
        self.step_split.refresh_view()
        self.redraw_chart(force=False)
        self.update_header()
        self.update_status()
        self.update_baseline()
        self.leak_banner.tick()
        self._check_role()
        self._check_failed()
        self._maybe_freeze_gc()

    def _poll_first_sample(self: Any) -> None:
        """Until the first sample is shown: a len() per poll, a refresh once records wait."""
        if self.last_sample is not None or self.run_state.finished:
            self._first_sample_timer.stop()
        elif self.ring is not None and len(self.ring):
            self.refresh_from_source()

    def _take(self: Any, records: list[Record]) -> None:
        samples: list[StepSample] = []
        for record in records:
            if self.ranks_mode:
                self._take_rank(record)
                if record.rank != 0:
                    continue
            self.run_state.apply(record)
            if isinstance(record, StepSample):
                samples.append(record)
            else:
                self.show_event(record)
        if samples:
            self._take_samples(samples)

    def _take_samples(self: Any, samples: list[StepSample]) -> None:
        rows = [sample_values(s) for s in samples]
        for spec in PANES:
            pane = self.panes.get(spec.id)
            if pane is not None:  # a sample the pane holds its last value over is left out
                pane.push([row[spec.id] for row, s in zip(rows, samples, strict=True)
                           if spec.holds_last is None or not spec.holds_last(s)])
        last = samples[-1]
        self.last_sample = last
        self.update_notes()
        for spec in PANES:
            if spec.sample_label is not None:
                label = spec.sample_label(last)
                if label != self.panes[spec.id].label:
                    self.panes[spec.id].relabel(label, label)
        self.chart.add_points(samples)
        self.ledger.push(samples)  # its live "fits B ≤ …" line (probes/analysis/fit_live.py)
        self.step_split.push(samples, self.run_state.started, self.device_type)
        for infer_pane in self.infer_panes:
            infer_pane.push(samples)
        if self.baseline is not None:
            for s in samples:
                self.baseline.push(s)

    def redraw_chart(self: Any, force: bool = True) -> None:
        """Bring the chart up to date (every ~5 s on the timer; at once for a screenshot)."""
        peak = self.last_sample.peak_allocated_bytes if self.last_sample else None
        if self.chart.maybe_redraw(peak, force=force):
            self.chart_box.border_title = self.chart.title()

    def _maybe_freeze_gc(self: Any) -> None:
        """Once the run has started: collect, then freeze, so gen-2 passes stop walking
        torch's and Textual's ~330k long-lived objects (a ~100 ms GIL hold each,
        docs/ARCHITECTURE.md), as the trainer does (trainer/loop.py). CPython's thresholds stay:
        what a gen-2 pass walks after the freeze is the garbage since the last one (rendered
        strips, ~1 µs an object here), so frequent passes are the short ones: 17 ms median
        against ~100 ms when they were spaced 10× further apart (benchmarks/RESULTS.md)."""
        if self.freeze_gc and not self._gc_frozen and self.run_state.state != "starting":
            gc.collect()
            gc.freeze()
            self._gc_frozen = True

    def relabel(self: Any, device_type: str) -> None:
        """Pane labels say what the counters are on this device (a viewer learns it late)."""
        if device_type == self.device_type:
            return
        self.device_type = device_type
        labels, short = pane_labels(device_type), pane_labels(device_type, short=True)
        for spec in PANES:
            if spec.sample_label is None:  # else the sample names it (tokens/samples/steps)
                self.panes[spec.id].relabel(labels[spec.id], short[spec.id])
        self.chart.set_labels(chart_labels(device_type))

    def update_notes(self: Any) -> None:
        """The line under each pane's value that has a note (tui/panes.py), from the newest
        sample and the run_started row."""
        started = self.run_state.started or {}
        for spec in PANES:
            if spec.note is not None:
                self.panes[spec.id].set_note(spec.note(self.last_sample, started))
