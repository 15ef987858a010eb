"""Plots of a run over time, one line per node, drawn with matplotlib's Agg backend.

Figures are made with ``matplotlib.figure.Figure`` and an Agg canvas directly, never through
``pyplot``: no display is needed, no global figure state is kept, and ``murmur swarm`` can draw
from a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from node.cli.history import EvalPoint, NodeHistory

__all__ = ["Panel", "plot_metric", "plot_panels"]

Colour = tuple[float, float, float, float]


def _colours(n: int) -> list[Colour]:
    cmap = colormaps["tab10" if n <= 10 else "tab20" if n <= 20 else "viridis"]
    if n > 20:
        return [cmap(i / max(n - 1, 1)) for i in range(n)]
    return [cmap(i) for i in range(n)]


def plot_metric(
    histories: Sequence[NodeHistory],
    t0: float,
    value: Callable[[EvalPoint], float | None],
    path: Path,
    title: str,
    ylabel: str,
    log_scale: bool = False,
) -> None:
    """Draw ``value`` of every evaluation over time, one line per node, to a PNG at ``path``.

    Each session of a node is its own line segment, so a restart shows as a gap; a dotted
    vertical line in the node's colour marks the moment it started again.

    Args:
        histories: the nodes; each line is labelled with the first 8 characters of its id.
        t0: unix time of the run's first record, the origin of the x axis.
        value: the value of one evaluation, or None to leave that evaluation out.
        log_scale: use a log y axis, if every value drawn is positive.
    """
    fig = Figure(figsize=(9, 4.8), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    drawn: list[float] = []
    restarted = False
    for history, colour in zip(histories, _colours(len(histories)), strict=True):
        label = history.node_id[:8]
        for k, session in enumerate(history.sessions):
            points = [(e.time - t0, v) for e in session.evals if (v := value(e)) is not None]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, color=colour, marker="o", markersize=3, linewidth=1.4, label=label)
                drawn.extend(ys)
                label = "_nolegend_"  # one legend entry per node, not per session
            if k > 0:
                ax.axvline(session.started - t0, color=colour, linestyle=":", linewidth=1.4)
                restarted = True
    if not drawn:
        ax.text(0.5, 0.5, "nothing logged", transform=ax.transAxes, ha="center", va="center")
    elif log_scale and min(drawn) > 0:
        ax.set_yscale("log")
    ax.set_xlim(left=0)
    ax.set_title(title)
    ax.set_xlabel("seconds since the run's first record")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if restarted:
        handles.append(Line2D([], [], color="grey", linestyle=":"))
        labels.append("restart")
    if handles:
        fig.legend(handles, labels, loc="outside right upper", title="node", fontsize="small")
    fig.savefig(path, format="png")


@dataclass(frozen=True)
class Panel:
    """One plot of a figure: named lines of (x, y) points."""

    title: str
    ylabel: str
    lines: Mapping[str, Sequence[tuple[float, float]]]
    log_scale: bool = False


def plot_panels(panels: Sequence[Panel], path: Path, title: str, xlabel: str) -> None:
    """Draw ``panels`` side by side in rows of two, to a PNG at ``path`` (``murmur simulate``)."""
    rows = (len(panels) + 1) // 2
    fig = Figure(figsize=(11, 3.6 * rows), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(title)
    for k, panel in enumerate(panels):
        ax = fig.add_subplot(rows, 2, k + 1)
        drawn: list[float] = []
        for (name, points), colour in zip(
            panel.lines.items(), _colours(len(panel.lines)), strict=True
        ):
            finite = [(x, y) for x, y in points if y == y]  # NaN: nothing to draw
            if finite:
                xs, ys = zip(*finite, strict=True)
                ax.plot(xs, ys, color=colour, linewidth=1.4, label=name)
                drawn.extend(ys)
        if panel.log_scale and drawn and min(drawn) > 0:
            ax.set_yscale("log")
        ax.set_title(panel.title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, alpha=0.3)
        if len(panel.lines) > 1:
            ax.legend(fontsize="small")
    fig.savefig(path, format="png")
