"""Line charts as text with plotext, for the terminal (colours when it is one) and for the
markdown files of `memtop compare` and `memtop sweep` (no colours)."""

from __future__ import annotations

from collections.abc import Sequence


def line_chart(series: Sequence[tuple[str, Sequence[float], Sequence[float]]], *, title: str,
               xlabel: str, ylabel: str, width: int = 78, height: int = 20,
               color: bool = False, markers: Sequence[str] | None = None) -> str:
    """``series``: (label, xs, ys) each; returns the chart as text."""
    import plotext as plt

    plt.clear_figure()
    plt.plotsize(width, height)
    plt.theme("clear" if not color else "pro")
    for i, (label, xs, ys) in enumerate(series):
        if not xs:
            continue
        marker = markers[i % len(markers)] if markers else "braille"
        plt.plot(list(xs), list(ys), label=label, marker=marker)
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
