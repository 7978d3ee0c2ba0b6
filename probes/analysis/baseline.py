"""A run against a saved baseline (tutorial exercise 8): the live run's headline figures so far,
counted the way `memtop compare` counts a finished run's, and their change from the baseline's.

``LiveFigures`` folds step samples as they come (cheap: a bounded window, a median on demand);
at the end the report holds the full comparison (probes/analysis/report/sections/baseline.py).
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

from probes.analysis.compare.compare import load_run
from probes.records import StepSample, is_disturbed
from probes.runfolder import RunFolderError
from probes.tools.stats import percentile

LIVE_WINDOW = 512  # the medians are over the last this-many measured steps


class LiveFigures:
    """tokens/s and step time medians over measured steps (after warmup, the disturbed steps
    left out, as compare.load_run does: records/disturbed.py), and the peak allocated after
    the warmup reset."""

    def __init__(self, warmup_steps: int, window: int = LIVE_WINDOW) -> None:
        self.warmup_steps = warmup_steps
        self.tokens: deque[float] = deque(maxlen=window)
        self.step_ms: deque[float] = deque(maxlen=window)
        self.peak: int | None = None

    def push(self, s: StepSample) -> None:
        if s.step >= max(self.warmup_steps, 1) and s.peak_allocated_bytes is not None:
            self.peak = max(self.peak or 0, s.peak_allocated_bytes)
        if s.step <= self.warmup_steps or is_disturbed(s):
            return
        if s.tokens_per_s is not None:
            self.tokens.append(s.tokens_per_s)
        self.step_ms.append(s.step_ms)

    def figures(self) -> dict[str, float | None]:
        return {"tokens_per_s": percentile(list(self.tokens), 50),
                "step_ms": percentile(list(self.step_ms), 50),
                "peak_allocated_bytes": self.peak}


def baseline_figures(headline: dict[str, Any]) -> dict[str, float | None]:
    """The same three figures from a finished run's headline (compare.RunFigures.headline)."""
    tps, ms = headline.get("tokens_per_s"), headline.get("step_ms")
    return {"tokens_per_s": tps["median"] if tps else None,
            "step_ms": ms["median"] if ms else None,
            "peak_allocated_bytes": headline.get("peak_allocated_bytes")}


def deltas(base: dict[str, float | None],
           now: dict[str, float | None]) -> dict[str, float | None]:
    """Relative change of each figure (now / base - 1); None where either is unknown."""
    out: dict[str, float | None] = {}
    for key, b in base.items():
        n = now.get(key)
        out[key] = n / b - 1 if b and n is not None else None
    return out


def load_baseline(path: str | Path) -> dict[str, Any]:
    """The baseline run's headline figures; RunFolderError (one sentence) if it is not a run."""
    return load_run(path).headline()


class BaselineWatch:
    """A live run against its baseline: the baseline's figures read once, the run's folded per
    sample. ``error`` (one sentence) when the baseline cannot be read; then nothing to show."""

    def __init__(self, path: str, warmup_steps: int) -> None:
        self.name = Path(path).name
        self.base: dict[str, float | None] | None = None
        self.error: str | None = None
        self.live = LiveFigures(warmup_steps)
        try:
            self.base = baseline_figures(load_baseline(path))
        except (RunFolderError, OSError, ValueError) as exc:
            self.error = f"baseline {path}: {exc}"

    def push(self, s: StepSample) -> None:
        if self.base is not None:
            self.live.push(s)

    def now(self) -> tuple[dict[str, float | None], dict[str, float | None]]:
        """(the run's figures so far, their change from the baseline's)."""
        now = self.live.figures()
        return now, deltas(self.base or {}, now)
