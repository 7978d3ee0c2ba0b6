"""The dashboard's one-line bars, assembled from the run's state at every refresh: the header
(device, shape, step, clock, state), the status line (profiler, leak demo, how the run ended,
where its folder is), the `--baseline` line, and the failure banner. Their text is built by the
pure functions of tui/format.py; this mixin only gathers what they need from the app.
"""

from __future__ import annotations

from typing import Any

from probes.records import switches_text
from tui.format import fit, header_text, leak_demo_text, profile_text, state_text
from tui.format_attribution import attribution_text
from tui.format_panels import baseline_text


def header_shape(config: dict[str, Any], started: dict[str, Any]) -> tuple[
        int | None, int | None, str | None]:
    """(B, T, switches) for the header: a training run's config B and T; an inference run's
    prompt plus new tokens and its switches; `memtop fit`'s probe ran several shapes, so none
    (its header says "fit probe")."""
    if config.get("mode") == "infer":
        seq = (config.get("prompt_len") or 0) + (config.get("new_tokens") or 0)
        return config.get("batch_size"), seq, switches_text(started.get("switches"),
                                                            short=True)
    if config.get("mode") == "fit":
        return None, None, "fit probe"
    return config.get("batch_size"), config.get("seq_len"), None

class StatusBars:
    """Mixed into MemtopApp (tui/app.py); uses its run state, source and key flags."""

    def elapsed_s(self: Any) -> float:
        """The header's clock: the run's time without its pauses (held while paused)."""
        trainer, st = self.trainer, self.run_state
        if trainer is not None and trainer.alive and not st.finished:
            now = trainer.elapsed_s()
        else:
            now = self.last_sample.time_s if self.last_sample else st.time_s
        return st.run_clock(now)

    @property
    def want_paused(self: Any) -> bool:
        """The run is paused or a pause was asked for (and no resume since)."""
        return self._pause_pending == "pause" or (
            self.run_state.state == "paused" and self._pause_pending != "resume")

    def update_header(self: Any) -> None:
        st = self.run_state
        state = state_text(st.state, st.profile_phase, self.want_paused, self._quitting)
        if not self.source.in_process and not st.finished and not self.source.live:
            state = "not live"  # a followed run whose process answers no more (killed?)
        batch, seq, switches = header_shape(self.config, st.started or {})
        text = header_text(
            device_name=st.device_name, device_total=st.device_total_bytes, switches=switches,
            amp=st.amp or "…", amp_reason=(st.started or {}).get("amp_reason"), batch=batch,
            seq=seq, params=st.params or None, step=st.step,
            elapsed_s=self.elapsed_s(), state=state,
            width=self.header_bar.size.width or self.size.width or 80)
        self.header_bar.show(text, state)

    def update_status(self: Any) -> None:
        st = self.run_state
        parts = [
            profile_text(st.profile_phase, self._profile_requested, self.can("profile"),
                         st.profile_done_window),
            leak_demo_text(st.leak_kind or self.config.get("leak"), st.leak_active,
                           st.leak_since, self._leak_toggling, self.can("leak_start")),
        ]
        if st.attribution_phase or self._attribution_requested or st.attribution_done_step:
            parts.insert(1, attribution_text(st.attribution_phase, self._attribution_requested,
                                             self.can("attribute"), st.attribution_done_step))
        if st.state == "failed":
            parts.append(f"failed at step {st.step}: {st.error or st.stop_reason or '?'}")
        elif st.finished:  # the header's word, with the reason when it says more
            reason = st.stop_reason or "?"
            if reason.startswith(st.state):  # "interrupted (terminal lost)" says it already
                parts.append(f"{reason} at step {st.step}")
            else:
                parts.append(f"{st.state} at step {st.step}" + (
                    "" if reason == "finished" else f" ({reason})"))
        elif self._quitting:
            parts.append("stopping: waiting for the step to end…")
        note = self.source.note
        if note:
            parts.append(note)
        if self.ranks_mode:
            parts.append(f"{len(self.rank_table.rows)} ranks")
        if not self.source.in_process and self.ending is None:
            parts.append("viewing" + ("" if self.source.live else " (not live)"))
        parts.append(f"run {self.run_dir}")
        width = self.status_line.size.width or self.size.width or 80
        self.status_line.show(fit(" " + " │ ".join(parts), width))

    def update_baseline(self: Any) -> None:
        """The `--baseline RUN` line (tutorial exercise 8), when the run names one."""
        watch = self.baseline
        if watch is None:
            return
        if watch.base is None:
            self.baseline_bar.show(f"{watch.error}")
            return
        now, change = watch.now()
        width = (self.baseline_bar.size.width or self.size.width or 80) - 2
        self.baseline_bar.show(baseline_text(watch.name, watch.base, now, change, width))

    def _check_failed(self: Any) -> None:
        self._show_rank_failure()
        st = self.run_state
        if st.state == "failed" and not self.error_banner.shown:
            self.error_banner.show_message(f"{self._what} FAILED at step {st.step}: {st.error}\n"
                                           "the last samples stay on screen; q quits")
        build_error = getattr(self.trainer, "build_error", None)
        if build_error and not self.error_banner.shown:
            self.error_banner.show_message(f"the trainer could not start: {build_error}\nq quits")
