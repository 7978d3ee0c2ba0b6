"""Line charts as text with plotext, for the terminal (colours when it is one) and for the
markdown files of `memtop compare` and `memtop sweep` (no colours)."""

from __future__ import annotations

from collections.abc import Sequence


def line_chart(series: Sequence[tuple[str, Sequence[float], Sequence[float]]], *, title: str,
               xlabel: str, ylabel: str, width: int = 78, height: int = 20,
               color: bool = False, markers: Sequence[str] | None = None,
               points: Sequence[bool] | None = None) -> str:
    """``series``: (label, xs, ys) each; ``points[i]``: draw series i as unjoined points
    (measurements) rather than a line. Returns the chart as text."""
    import plotext as plt

    plt.clear_figure()
    plt.plotsize(width, height)
    plt.theme("clear" if not color else "pro")
    for i, (label, xs, ys) in enumerate(series):
        if not xs:
            continue
        marker = markers[i % len(markers)] if markers else "braille"
        draw = plt.scatter if points and points[i % len(points)] else plt.plot
        draw(list(xs), list(ys), label=label, marker=marker)
    plt.title(title)
    plt.xlabel(xlabel)
    plt.ylabel(ylabel)
    text = plt.build()
    plt.clear_figure()
    if not color:
        text = plt.uncolorize(text)
    return text


def loss_chart(curves: list[dict], color: bool = False, width: int = 78) -> str:
    """The loss curves of compared runs on one chart."""
    tags = "ABCDEFGH"
    series = [(f"{tags[i] if i < len(tags) else i}: {c['run']}", c["steps"], c["loss"])
              for i, c in enumerate(curves)]
    return line_chart(series, title="loss per step", xlabel="step", ylabel="loss",
                      color=color, width=width, markers=["dot", "x", "+", "o"])


def sweep_charts(data: dict, color: bool = False, width: int = 78) -> list[tuple[str, str]]:
    """Peak allocated vs T per series, measured points with the fitted a + b·T + c·T² drawn
    through them (explicit and sdpa on the same axes when both were swept); tokens/s vs T."""
    from probes.analysis.sweep import OK, peak_names, series_label, varied

    rows = [r for r in data["cells"] if r["status"] == OK]
    if not rows:
        return []
    axes = varied(data["cells"])
    fitted: list[tuple[str, list[float], list[float]]] = []  # drawn first: points on top
    points: list[tuple[str, list[float], list[float]]] = []
    tps_series: list[tuple[str, list[float], list[float]]] = []
    for f in data["fits"]:
        key = (f["attention"], f["amp"], f["dim"], f["layers"], f["batch_size"])
        cells = sorted((r for r in rows if (r["attention"], r["amp"], r["dim"], r["layers"],
                                            r["batch_size"]) == key),
                       key=lambda r: r["seq_len"])
        label = series_label(f, axes)
        ts = [r["seq_len"] for r in cells]
        points.append((label, ts, [r["peak_allocated_bytes"] / 2**20 for r in cells]))
        if f["c"] is not None:
            lo, hi = min(ts), max(ts)
            dense = [lo + (hi - lo) * k / 40 for k in range(41)]
            fitted.append((f"{label} fit", dense,
                           [(f["a"] + f["b"] * t + f["c"] * t * t) / 2**20 for t in dense]))
        tps = [(r["seq_len"], r["tokens_per_s_p50"]) for r in cells
               if r.get("tokens_per_s_p50") is not None]
        tps_series.append((label, [t for t, _ in tps], [v for _, v in tps]))
    # each fit its own small mark (one shared mark read as one curve), each series' points
    # a letter-like one; the legend pairs them
    marks = [FIT_MARKS[k % len(FIT_MARKS)] for k in range(len(fitted))] + \
        ["ox+*#@%&"[k % 8] for k in range(len(points))]
    name = peak_names(data)["peak_allocated_bytes"]
    peak = line_chart(fitted + points, title=f"{name} (MiB) vs T: marks measured, "
                      "small marks fitted a+b·T+c·T²", xlabel="T (tokens per sequence)",
                      ylabel="MiB", color=color, width=width, height=24, markers=marks,
                      points=[False] * len(fitted) + [True] * len(points))
    tps = line_chart(tps_series, title="tokens/s p50 vs T", xlabel="T", ylabel="tokens/s",
                     color=color, width=width, height=16, markers=["o", "x", "+", "*"])
    return [(f"{name[0].upper()}{name[1:]} vs T", peak), ("Tokens/s vs T", tps)]


FIT_MARKS = ("·", "-", "~", "=")  # the fitted curves' marks in the sweep chart, one per series


SPARK_BARS = "▁▂▃▄▅▆▇█"
SPARK_FLAT_FRACTION = 0.01  # a spread under this share of the largest value draws flat


def bar_levels(data: Sequence[float], width: int) -> list[int]:
    """A sparkline's bar heights (0..7, an index into SPARK_BARS), one per cell, as Textual's
    Sparkline draws them: the largest value gets the tallest bar; with more points than cells
    each cell shows the largest point of its share, with fewer each point is stretched over its
    cells. Empty data or no width: no cells."""
    n = len(data)
    if n == 0 or width <= 0:
        return []
    if n >= width:
        cells = [max(data[i * n // width:max(i * n // width + 1, (i + 1) * n // width)])
                 for i in range(width)]
    else:
        cells = [data[i * n // width] for i in range(width)]
    lo, hi = min(data), max(data)
    if hi - lo <= SPARK_FLAT_FRACTION * max(abs(hi), abs(lo)):
        return [0] * len(cells)  # sub-1% jitter is not a trend: flat (SPARK_RULE)
    extent = hi - lo or 1.0
    top = len(SPARK_BARS) - 1
    return [min(top, int((v - lo) / extent * top)) for v in cells]


def spark_rule(history_steps: int) -> str:
    """What a pane's min/max and sparkline cover, for the help screen and the README."""
    return (f"[b]min / max and the sparkline[/b]: min and max are over the pane's last "
            f"{history_steps} steps; the sparkline draws the most recent steps, one per column, "
            f"scaled from their min to their max, and draws flat when they differ by less than "
            f"{SPARK_FLAT_FRACTION:.0%} of the value (jitter is not a trend).")


def bar_runs(levels: Sequence[int]) -> list[tuple[int, int]]:
    """(level, count) for each run of equal bars: a sparkline drawn as a few text runs."""
    runs: list[tuple[int, int]] = []
    for level in levels:
        if runs and runs[-1][0] == level:
            runs[-1] = (level, runs[-1][1] + 1)
        else:
            runs.append((level, 1))
    return runs
