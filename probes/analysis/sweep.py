"""The B×T sweep's logic (tutorial exercise 6): the grid, each cell's figures read from its run
folder, the peak fit a + b·T + c·T² per series, and sweep.json / sweep.csv / sweep.md.

No torch, no Textual, no child processes: tui/sweep_runner.py runs the cells. A cell's figures come
from its run folder through probes/analysis/compare/compare.py, the same reading `memtop compare`
does.
"""

from __future__ import annotations

import csv
import io
import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from probes.analysis.compare.compare import load_run
from probes.records.names import counter_names, peak_name
from probes.runfolder import RunFolderError, find_runs, write_json, write_text
from probes.tools.tables import markdown_table
from probes.tools.units import format_bytes, format_duration, format_ms, format_rate

SWEEP_VERSION = 1
AXES = ("batch_size", "seq_len", "attention", "amp", "dim", "layers")
OK, OOM, FAILED, NOT_RUN = "ok", "oom", "failed", "not run"
INTERRUPTED = "interrupted"  # the cell that was running when the sweep was stopped
NEGLIGIBLE_SHARE = 0.005  # a c·T² share below this at every T is called no T² term
_OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory")
CSV_FIELDS = ("cell", *AXES, "status", "peak_allocated_bytes", "peak_reserved_bytes",
              "tokens_per_s_p50", "step_ms_p50", "step_ms_p95", "wall_s", "reason", "run_dir")


def parse_list(text: str, flag: str, kind: type = int) -> list[Any]:
    """'1,4,8' -> [1, 4, 8]; ValueError with one sentence on an empty or bad list."""
    items = [x.strip() for x in str(text).split(",")]
    if not any(items):
        raise ValueError(f"{flag} is an empty list; give values separated by commas, e.g. 1,4,8")
    if not all(items):
        raise ValueError(f"{flag} {text!r} has an empty item")
    out: list[Any] = []
    for item in items:
        try:
            value = kind(item)
        except ValueError:
            raise ValueError(f"{flag} {text!r}: {item!r} is not an integer") from None
        if value not in out:
            out.append(value)
    return out


@dataclass(frozen=True)
class Cell:
    batch_size: int
    seq_len: int
    attention: str
    amp: str
    dim: int
    layers: int

    @property
    def key(self) -> str:
        """The cell's folder name, e.g. b4-t128-explicit-bf16-d128-l4."""
        return (f"b{self.batch_size}-t{self.seq_len}-{self.attention}-{self.amp}-d{self.dim}"
                f"-l{self.layers}")

    @property
    def series(self) -> tuple[str, str, int, int, int]:
        """What stays fixed along T: the fit is done per series."""
        return (self.attention, self.amp, self.dim, self.layers, self.batch_size)


def grid(axes: dict[str, Sequence[Any]]) -> list[Cell]:
    """Every combination, T varying fastest (one series' cells run one after the other)."""
    order = ("attention", "amp", "dim", "layers", "batch_size", "seq_len")
    for name in order:
        if not axes.get(name):
            raise ValueError(f"--{name.replace('_', '-')} is an empty list")
    return [Cell(**dict(zip(order, combo, strict=True)))
            for combo in itertools.product(*(axes[n] for n in order))]


def classify(run_dir: Path | None, returncode: int | None) -> tuple[str, str | None]:
    """(status, reason) of a finished child: ok, oom (allocator error, --max-memory, or killed
    by SIGKILL, which is how the kernel's OOM killer ends a process) or failed."""
    run = None
    if run_dir is not None:
        try:
            run = load_run(run_dir)
        except RunFolderError:
            run = None
    if run is not None and run.memory_guard:
        return OOM, f"stopped by --max-memory ({run.reason})"
    if run is not None and run.error_type is not None:
        text = (run.reason or "").lower()
        if "outofmemory" in run.error_type.lower() or any(t in text for t in _OOM_TEXT):
            return OOM, run.reason
        return FAILED, run.reason
    if returncode in (-9, 137):
        return OOM, "killed by SIGKILL (the kernel's OOM killer, most likely)"
    if run is None:
        return FAILED, f"no run folder (exit status {returncode})"
    if returncode != 0 or run.outcome != "finished":
        return FAILED, run.reason or f"exit status {returncode}"
    return OK, None


def cell_result(cell: Cell, run_root: Path, returncode: int | None,
                wall_s: float | None) -> dict[str, Any]:
    """The cell's row: its axes, status and figures (None where it has none)."""
    runs = find_runs(run_root) if run_root.is_dir() else []
    run_dir = runs[-1] if runs else None
    status, reason = classify(run_dir, returncode)
    row: dict[str, Any] = {"cell": cell.key, **asdict(cell), "status": status, "reason": reason,
                           "wall_s": wall_s, "run_dir": str(run_dir) if run_dir else None,
                           "returncode": returncode}
    figures = load_run(run_dir).headline() if run_dir is not None and status == OK else {}
    row["device"] = figures.get("device")  # what ran: the counters' names follow it
    tps, ms = figures.get("tokens_per_s"), figures.get("step_ms")
    row.update(peak_allocated_bytes=figures.get("peak_allocated_bytes"),
               peak_reserved_bytes=figures.get("peak_reserved_bytes"),
               tokens_per_s_p50=tps["median"] if tps else None,
               step_ms_p50=ms["median"] if ms else None,
               step_ms_p95=figures.get("step_ms_p95"),
               measured_steps=figures.get("measured_steps"))
    return row


def not_run_row(cell: Cell, why: str = "the sweep was interrupted first") -> dict[str, Any]:
    return {"cell": cell.key, **asdict(cell), "status": NOT_RUN, "reason": why}


def interrupted_row(cell: Cell, root: Path) -> dict[str, Any]:
    """The cell that was running when the sweep was stopped: one status in sweep.md, .csv and
    .json alike (it was "not run" in one and "interrupted while running" in another)."""
    return {"cell": cell.key, **asdict(cell), "status": INTERRUPTED,
            "reason": f"stopped while running; its partial run folder is kept under {root}"}


def peak_names(data: dict[str, Any]) -> dict[str, str]:
    """The peaks' names in the sweep's files and chart: the counters' one names on the device
    the cells ran on (probes/records/names.py: heap peak / peak heap held on CPU)."""
    devices = sorted({str(r["device"]) for r in data["cells"] if r.get("device")})
    if not devices and data.get("device") not in (None, "auto"):
        devices = [str(data["device"])]
    devices = devices or ["cpu"]
    return {"peak_allocated_bytes": counter_names("peak", *devices),
            "peak_reserved_bytes": peak_name("reserved", *devices)}


# ---- the fit ------------------------------------------------------------------------------------
def fit_quadratic(ts: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float] | None:
    """Least squares y = a + b·T + c·T² (numpy); None with fewer than three distinct T."""
    import numpy as np

    if len(set(ts)) < 3:
        return None
    scale = float(max(ts))
    t = np.asarray(ts, dtype=float) / scale  # keeps the normal equations well conditioned
    design = np.stack([np.ones_like(t), t, t * t], axis=1)
    (a, b, c), *_ = np.linalg.lstsq(design, np.asarray(ys, dtype=float), rcond=None)
    return float(a), float(b) / scale, float(c) / scale**2


def t2_share(coef: tuple[float, float, float], t: float) -> float | None:
    """c·T² over the fitted peak at T: the part of the peak that grows with T²."""
    a, b, c = coef
    total = a + b * t + c * t * t
    return c * t * t / total if total > 0 else None


def fits(rows: list[dict[str, Any]], metric: str = "peak_allocated_bytes") -> list[dict]:
    """One fit per series (attention, amp, dim, layers, B) over its finished cells."""
    out = []
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["status"] == OK and r.get(metric) is not None:
            key = (r["attention"], r["amp"], r["dim"], r["layers"], r["batch_size"])
            groups.setdefault(key, []).append(r)
    for (attention, amp, dim, layers, b), cells in groups.items():
        cells.sort(key=lambda r: r["seq_len"])
        ts = [r["seq_len"] for r in cells]
        coef = fit_quadratic(ts, [r[metric] for r in cells])
        out.append({"attention": attention, "amp": amp, "dim": dim, "layers": layers,
                    "batch_size": b, "metric": metric, "points": len(cells),
                    "a": coef[0] if coef else None, "b": coef[1] if coef else None,
                    "c": coef[2] if coef else None,
                    "t2_share": {t: (t2_share(coef, t) if coef else None) for t in ts}})
    return out


def share_grows(fit: dict[str, Any]) -> bool | None:
    """Whether the c·T² share rises with T along the series (None without a fit)."""
    shares = [v for _, v in sorted(fit["t2_share"].items())]
    if len(shares) < 2 or any(v is None for v in shares):
        return None
    return all(b > a for a, b in zip(shares, shares[1:], strict=False))


# ---- the files ----------------------------------------------------------------------------------
def series_label(f: dict[str, Any], axes_varied: set[str]) -> str:
    parts = [f"B={f['batch_size']}"]
    for name, text in (("attention", f["attention"]), ("amp", f["amp"]),
                       ("dim", f"dim {f['dim']}"), ("layers", f"L{f['layers']}")):
        if name in axes_varied:
            parts.append(str(text))
    return " ".join(parts)


def varied(rows: list[dict[str, Any]]) -> set[str]:
    return {a for a in AXES if len({r[a] for r in rows}) > 1}


def table_lines(rows: list[dict[str, Any]], names: dict[str, str]) -> list[str]:
    header = ["cell", "status", names["peak_allocated_bytes"], names["peak_reserved_bytes"],
              "tokens/s p50", "step p50", "step p95", "wall"]
    body = [[r["cell"], r["status"], format_bytes(r.get("peak_allocated_bytes")),
             format_bytes(r.get("peak_reserved_bytes")), format_rate(r.get("tokens_per_s_p50")),
             format_ms(r.get("step_ms_p50")), format_ms(r.get("step_ms_p95")),
             format_duration(r.get("wall_s"))] for r in rows]
    return markdown_table(header, body).split("\n")


def fit_lines(fit_rows: list[dict[str, Any]], axes_varied: set[str]) -> list[str]:
    ts = sorted({t for f in fit_rows for t in f["t2_share"]})
    header = ["series", "a", "b per token", "c per token²", *(f"c·T² share T={t}" for t in ts)]
    body = []
    for f in fit_rows:
        if f["c"] is None:
            body.append([series_label(f, axes_varied), "n/a (fewer than 3 T)", "", "",
                         *("" for _ in ts)])
            continue
        shares = [f["t2_share"].get(t) for t in ts]
        body.append([series_label(f, axes_varied), format_bytes(f["a"]),
                     format_bytes(f["b"]), f"{f['c']:.1f} B",
                     *("" if s is None else f"{s:.1%}" for s in shares)])
    return markdown_table(header, body).split("\n")


def write_outputs(folder: Path, meta: dict[str, Any], rows: list[dict[str, Any]],
                  charts: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """sweep.json, sweep.csv and sweep.md (atomically, so a partial sweep's files are whole)."""
    fit_rows = fits(rows)
    data = {"sweep_version": SWEEP_VERSION, **meta, "cells": rows, "fits": fit_rows,
            "not_run": [r["cell"] for r in rows if r["status"] == NOT_RUN]}
    write_json(folder / "sweep.json", data)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: r.get(k) for k in CSV_FIELDS})
    write_text(folder / "sweep.csv", buf.getvalue())
    write_text(folder / "sweep.md", render_markdown(data, charts))
    return data


def render_markdown(data: dict[str, Any], charts: list[tuple[str, str]] | None = None) -> str:
    rows = data["cells"]
    axes_varied = varied(rows)
    lines = ["# memtop sweep", "", f"Command: `{data.get('command', '')}`", "",
             f"Device {data.get('device')}; {data.get('warmup_steps')} warmup + "
             f"{data.get('measured_steps')} measured steps per cell, each cell in a fresh "
             "process, one at a time.", ""]
    names = peak_names(data)
    lines += table_lines(rows, names) + [""]
    bad = [r for r in rows if r["status"] in (OOM, FAILED, INTERRUPTED)]
    for r in bad:
        lines.append(f"- {r['cell']}: {r['status']}: {r.get('reason')}")
    if data["not_run"]:
        lines.append(f"- Not run ({len(data['not_run'])}): {', '.join(data['not_run'])}")
    if bad or data["not_run"]:
        lines.append("")
    peak = names["peak_allocated_bytes"]
    lines += [f"## {peak[0].upper()}{peak[1:]} = a + b·T + c·T² per series (least squares)", ""]
    if data["fits"]:
        lines += fit_lines(data["fits"], axes_varied) + [""]
        for f in data["fits"]:
            grows = share_grows(f)
            top = max((v for v in f["t2_share"].values() if v is not None), default=None)
            if grows is None or top is None:
                continue
            label = series_label(f, axes_varied)
            if abs(top) < NEGLIGIBLE_SHARE:
                lines.append(f"- {label}: no T² term (the c·T² share stays under "
                             f"{NEGLIGIBLE_SHARE:.1%})")
            else:
                lines.append(f"- {label}: the c·T² share {'grows' if grows else 'does not grow'}"
                             f" with T, to {top:.1%}")
        lines += ["", "c·T² share = c·T² / (a + b·T + c·T²) at each T. With explicit "
                  "attention the B×heads×T×T scores are the T² term; sdpa does not store "
                  "them.", ""]
    else:
        lines += ["No finished cells to fit.", ""]
    for title, text in charts or []:
        lines += [f"## {title}", "", "```", text.rstrip(), "```", ""]
    lines += [f"Peaks: {peak} after the warmup reset (CUDA: max_memory_allocated; CPU: sampled "
              "heap, read at the end of forward and of each step); "
              f"{names['peak_reserved_bytes']}: max at step end. "
              "Each cell's run folder is kept under cells/."]
    return "\n".join(lines) + "\n"
