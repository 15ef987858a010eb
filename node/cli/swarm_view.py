"""``murmur swarm``'s live view: a table of its nodes' statuses that fits the terminal."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Protocol

from rich.console import Console
from rich.live import Live

from gossip.topology import resolved
from node.cli.tables import Column, FittedTable
from node.config import GossipConfig
from node.telemetry.progress import fmt_duration, fmt_size
from node.telemetry.status import NodeStatus

__all__ = ["SWARM_COLUMNS", "LiveView", "SwarmShape", "progress_view"]


class SwarmShape(Protocol):
    """What the view's title says of the swarm (node/cli/swarm_nodes.py ``SwarmConfig`` has it)."""

    @property
    def nodes(self) -> int: ...

    @property
    def steps(self) -> int: ...

    @property
    def gossip(self) -> GossipConfig: ...


#: The live table's columns: node, step and eval accuracy survive any width; the rest go from
#: the right end of this priority order: mix, train loss, eval loss, sent, rounds, vs fp32,
#: samples/s.
SWARM_COLUMNS = (
    Column("node", 0, "left", min_width=8, overflow="crop"),
    Column("step", 0),
    Column("train\nloss", 2),
    Column("eval\nloss", 3),
    Column("eval\nacc", 0),
    Column("mix", 1),
    Column("rounds", 5),
    Column("samples\n/s", 7),
    Column("sent", 4),
    Column("vs\nfp32", 6),
)


def _loss(x: float) -> str:
    return f"{x:.4f}" if math.isfinite(x) else "-"


def _judged(s: NodeStatus, metric: str) -> str:
    """The last column kept at any width: eval accuracy, or the perplexity of a task judged by
    it (a task judged by its loss alone has its eval loss in the column before)."""
    if s.eval_step < 0:
        return "-"
    if metric == "perplexity":
        return f"{math.exp(min(s.eval_loss, 700.0)):.2f}" if math.isfinite(s.eval_loss) else "-"
    return f"{s.eval_accuracy:.3f}" if s.eval_accuracy >= 0 else "-"


def progress_view(
    cfg: SwarmShape,
    statuses: Sequence[NodeStatus | None],
    elapsed: float,
    metric: str = "accuracy",
) -> FittedTable:
    """The live table of the swarm's nodes (fits the width it is drawn at); ``metric`` is the
    task's (node/tasks/base.py): a perplexity task shows its eval perplexity for accuracy."""
    g = cfg.gossip
    columns = SWARM_COLUMNS
    if metric == "perplexity":
        columns = (*columns[:4], dataclasses.replace(columns[4], header="eval\nppl"), *columns[5:])
    rows = []
    for index, s in enumerate(statuses):
        if s is None:
            rows.append([f"node {index}", "no answer", *["-"] * (len(SWARM_COLUMNS) - 2)])
            continue
        evaluated = s.eval_step >= 0
        rows.append(
            [
                s.node_id[:12],
                f"{s.step}/{s.step_budget}",
                _loss(s.train_loss),
                _loss(s.eval_loss) if evaluated else "-",
                _judged(s, metric),
                f"{sum(n.in_mix for n in s.neighbours)}/{len(s.neighbours)}",
                str(s.rounds),
                f"{s.samples_per_s:.0f}",
                fmt_size(s.bytes_sent),
                f"{100 * s.compression_ratio:.1f}%",
            ]
        )
    # The time first: a narrow terminal cuts the end of the line.
    title = (
        f"murmur swarm [{fmt_duration(elapsed)}]: {cfg.nodes} nodes, "
        f"{resolved(g.topology, cfg.nodes)}, {g.codec}, {cfg.steps} steps each"
    )
    return FittedTable(title, columns, rows)


class LiveView:
    """Redraws the table in place on a terminal (rich's Live); prints it now and then
    otherwise, at the terminal's width or 80 columns."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.console = Console(soft_wrap=False)
        self.tty = self.console.is_terminal
        self._live: Live | None = None
        self._last = 0.0

    def show(self, view: FittedTable, force: bool = False) -> None:
        if not self.enabled:
            return
        if self.tty:
            if self._live is None:
                self._live = Live(
                    console=self.console,
                    auto_refresh=False,
                    redirect_stderr=False,
                    vertical_overflow="ellipsis",
                )
                self._live.start()
            self._live.update(view, refresh=True)
            return
        now = time.monotonic()
        if not force and now - self._last < 5.0:
            return
        self._last = now
        self.console.print(view, crop=True)

    def close(self) -> None:
        """Leave the last frame on the screen (what follows prints below it)."""
        if self._live is not None:
            self._live.stop()
            self._live = None
