"""Markdown pipe tables whose raw text is aligned too, so report.md, compare.md and sweep.md read
the same in a terminal as they render on GitHub. The one table writer of the project."""

from __future__ import annotations

from typing import Any


def _cell(v: Any) -> str:
    text = "n/a" if v is None else str(v)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: list[str], rows: list[list[Any]], right: set[int] | None = None) -> str:
    """A GitHub pipe table whose raw text is aligned too."""
    right = right or set()
    cells = [[_cell(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(3, *(len(row[i]) for row in cells)) for i in range(len(headers))]

    def fmt(row: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if i in right else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(row, widths, strict=True))) + " |"

    sep = "| " + " | ".join(("-" * (w - 1) + ":") if i in right else "-" * w
                            for i, w in enumerate(widths)) + " |"
    return "\n".join([fmt(cells[0]), sep] + [fmt(row) for row in cells[1:]])
