"""Tables that fit the terminal, for ``murmur monitor`` and ``murmur swarm``'s live view.

A row never wraps: when the columns do not fit, the truncatable ones (an address, an id) give
up width first, down to their least, and then whole columns go, least important first, so a
table is always one line per node whatever the width. Rendering is rich's
(https://rich.readthedocs.io): its ``Live`` redraws in place exactly over the last frame, and a
:class:`FittedTable` asks for the width it is drawn at each time, so a resized terminal gets a
table of its new width at the next redraw.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

__all__ = ["Column", "FittedTable", "fit_columns", "render_text"]

#: Blank characters between two columns.
GAP = 1


@dataclass(frozen=True)
class Column:
    """Args:
    header: the heading; a newline splits it over two lines, so it is not what sets the
        width of a column of short values.
    priority: 0 for the key columns, kept at any width; the highest numbers go first.
    justify: numbers right, words left.
    min_width: the column may be cut down to this many characters; None: never cut.
    overflow: how a cut cell ends: ``ellipsis`` (…), or ``crop`` for ids, whose first
        characters are what a reader matches against other output.
    """

    header: str
    priority: int
    justify: Literal["left", "right"] = "right"
    min_width: int | None = None
    overflow: Literal["ellipsis", "crop"] = "ellipsis"


def _natural(column: Column, cells: Sequence[str]) -> int:
    return max([len(line) for line in column.header.split("\n")] + [len(c) for c in cells])


def fit_columns(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int
) -> list[tuple[int, int]]:
    """The columns kept at ``width``, as (index, width) pairs in their order.

    Truncatable columns shrink to their ``min_width`` before any column goes; then columns go
    by priority, the highest number first (the rightmost among equals). Key columns (priority
    0) stay even when they alone are wider than ``width`` (the renderer then crops the line).
    Width left over goes back to the truncated columns, the most important first.
    """
    natural = [_natural(c, [row[i] for row in rows]) for i, c in enumerate(columns)]
    least = [
        min(n, c.min_width) if c.min_width is not None else n
        for c, n in zip(columns, natural, strict=True)
    ]
    kept = list(range(len(columns)))

    def total(widths: Sequence[int]) -> int:
        return sum(widths[i] for i in kept) + GAP * max(0, len(kept) - 1)

    while total(least) > width:
        droppable = [i for i in kept if columns[i].priority > 0]
        if not droppable:
            break
        kept.remove(max(droppable, key=lambda i: (columns[i].priority, i)))
    widths = list(least)
    spare = width - total(widths)
    for i in sorted(kept, key=lambda i: (columns[i].priority, i)):
        grow = min(spare, natural[i] - widths[i])
        if grow > 0:
            widths[i] += grow
            spare -= grow
    return [(i, widths[i]) for i in kept]


@dataclass(frozen=True)
class FittedTable:
    """A title line and a table, fitted to the width they are drawn at (a rich renderable).

    Args:
        title: one line, cut with an ellipsis when too long.
        columns: the columns, in display order.
        rows: one row of cell texts per line, in ``columns``' order.
        footer: lines under the table (notes), each cut like the title.
    """

    title: str
    columns: Sequence[Column]
    rows: Sequence[Sequence[str]]
    footer: Sequence[str] = ()

    def fitted(self, width: int) -> Group:
        table = Table(
            box=None,
            padding=(0, GAP, 0, 0),
            pad_edge=False,
            show_edge=False,
            expand=False,
            header_style="bold",
        )
        kept = fit_columns(self.columns, self.rows, width)
        for i, w in kept:
            c = self.columns[i]
            table.add_column(
                c.header, justify=c.justify, width=w, no_wrap=True, overflow=c.overflow
            )
        for row in self.rows:
            table.add_row(*(row[i] for i, _ in kept))

        def line(text: str) -> Text:
            return Text(text, no_wrap=True, overflow="ellipsis")

        return Group(line(self.title), table, *map(line, self.footer))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.fitted(options.max_width)


def render_text(renderable: RenderableType, width: int) -> str:
    """``renderable`` as plain text at ``width`` columns (no colour, no control codes)."""
    out = io.StringIO()
    console = Console(
        file=out, width=width, color_system=None, force_terminal=False, legacy_windows=False
    )
    console.print(renderable, crop=True)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())
