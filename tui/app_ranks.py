"""The dashboard's side for several ranks (mixed into MemtopApp, tui/app.py): every rank's
records feed the rank table, while the panes and chart follow rank 0; a failure names the rank
that brought the run down (probes/analysis/ranks.py), over a peer's consequence."""

from __future__ import annotations

from typing import Any

from probes import records as R
from probes.records import Record, StepSample


class RanksView:
    """Uses the app's source, rank table and error banner."""

    def _take_rank(self: Any, record: Record) -> None:
        """Every rank's records feed the rank table; another rank's failure takes the banner."""
        table = self.rank_table
        if isinstance(record, StepSample):
            table.push(record)
            return
        d, name = record.data, record.event
        if name == R.LEAK_SUSPECTED:
            table.set_leak(record.rank, str(d.get("counter")))
        elif name == R.LEAK_CLEARED:
            table.set_leak(record.rank, None)
        elif name == R.RUN_FINISHED:
            table.set_finished(record.rank)
        elif name == R.ERROR:
            what = f"{d.get('error_type', 'Error')}: {d.get('message', '')}"
            table.set_failed(record.rank, f"step {record.step}: {what}")
            if record.rank != 0:
                self.error_banner.show_message(
                    f"RANK {record.rank} FAILED at step {record.step}: {what}\nthe other ranks "
                    "stop with it (torch.distributed.run); q quits")

    def _show_rank_failure(self: Any) -> None:
        failure = getattr(self.source, "failure", None)
        if failure and not self._failure_shown:  # the cause, over a peer's consequence
            self._failure_shown = True
            self.error_banner.show_message(f"RUN FAILED: {failure}\nthe other ranks' files are "
                                           "complete; q quits")
            rank = getattr(self.source, "failure_rank", None)
            row = self.rank_table.rows.get(rank) if rank is not None else None
            if rank is not None and (row is None or not row.failed):
                why = failure.split("; then")[0].removeprefix(f"rank {rank} ")
                self.rank_table.set_failed(rank, why)
