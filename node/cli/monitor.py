"""``murmur monitor``: every node of a swarm, live, from the MQTT broker the nodes report to.

It subscribes to the swarm's ``status`` and ``online`` topics (see :mod:`node.telemetry.mqtt`);
since both are retained, it shows every node that ever reported as soon as it connects, the departed
ones offline (``--hide-departed`` leaves them out), and the ones whose status has not been renewed
for a few publish intervals stale, whatever their flags say. The table fits the terminal
(:mod:`node.cli.tables`); ``--once`` collects for a while and prints once, for scripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

import aiomqtt
from rich.console import Console
from rich.live import Live

from node.cli.tables import Column, FittedTable, render_text
from node.telemetry.mqtt import Backoff, make_client
from node.telemetry.mqtt_messages import OFFLINE, ONLINE, MqttConfig, parse_status
from node.telemetry.progress import fmt_duration, fmt_size

__all__ = ["MonitorConfig", "SwarmBoard", "run_monitor"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MonitorConfig:
    """Args:
    mqtt: the broker, swarm and prefix (the rest of it is unused here).
    once: print once after ``timeout_s`` and exit, instead of a live table.
    timeout_s: how long ``once`` collects statuses.
    json: print the statuses as JSON instead of a table.
    refresh_s: seconds between two redraws of the live table.
    hide_departed: leave out the nodes that left (offline) or went silent long ago
        (:data:`DEPARTED_AFTER_S`).
    width: the table's width in columns; None: the terminal's (80 when there is none).
    """

    mqtt: MqttConfig
    once: bool = False
    timeout_s: float = 3.0
    json: bool = False
    refresh_s: float = 1.0
    hide_departed: bool = False
    width: int | None = None

    def __post_init__(self) -> None:
        if self.width is not None and self.width < 20:
            raise ValueError(f"the monitor needs a width of 20 columns at least, got {self.width}")


#: A node whose last status is this many of its publish intervals old is stale...
STALE_INTERVALS = 3
#: ...and at least this many seconds old: a busy node or broker delays a status by a second or
#: two, which must not make it flicker.
STALE_MIN_S = 5.0
#: The publish interval assumed for a status that does not say its own (nodes before 0.2 did not).
DEFAULT_INTERVAL_S = 2.0
#: ``hide_departed`` also hides stale nodes silent this long: a node killed while the broker was
#: down stays "online" on the broker for good (its last will never reached it).
DEPARTED_AFTER_S = 600.0


@dataclass
class _Node:
    status: dict[str, Any]
    #: Wall-clock seconds when it was last heard from (see :meth:`SwarmBoard.receive`).
    heard: float


class SwarmBoard:
    """The last status of each node the broker told of, its last online flag (which wins over
    the status's own ``online``: a killed node's retained status still says true), and when it
    was last heard from, which makes a node stale whatever its flags say.

    A node is ``online``, ``offline`` (it said goodbye, or the broker published its last will),
    or ``stale``: said to be online, but its last status is older than a few of its publish
    intervals. That is the node killed while the broker was down, whose last will never
    reached the broker, or one cut off from it.
    """

    def __init__(self, cfg: MqttConfig, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        #: Wall-clock seconds, as the statuses' ``time``.
        self.clock = clock
        self._nodes: dict[str, _Node] = {}
        self._online: dict[str, bool] = {}
        #: Shown in the table's first line: why what it shows may be old.
        self.note = ""

    def receive(
        self, topic: str, payload: bytes, retained: bool = False, now: float | None = None
    ) -> None:
        """Take one message. A live one was heard ``now``; a retained one (sent on
        subscribing) is as old as its status's own ``time``, or as ``now`` if that is later
        (a node whose clock runs ahead), so a dead node's status goes stale all the same."""
        now = self.clock() if now is None else now
        parsed = self.cfg.parse_topic(topic)
        if parsed is None:
            return
        node_id, kind = parsed
        if kind == "online" and payload in (ONLINE, OFFLINE):
            self._online[node_id] = payload == ONLINE
        elif kind == "status" and not payload:  # a retained status cleared by hand
            self._nodes.pop(node_id, None)
        elif kind == "status":
            status = parse_status(payload)
            if status is None or status["node_id"] != node_id:
                log.debug("ignoring a bad status on %s", topic)
                return
            heard = min(float(status["time"]), now) if retained else now
            self._nodes[node_id] = _Node(status, heard)

    def _state(self, node_id: str, node: _Node, now: float) -> str:
        if not self._online.get(node_id, node.status["online"]):
            return "offline"
        interval = node.status.get("interval_s")
        if not isinstance(interval, int | float) or isinstance(interval, bool) or interval <= 0:
            interval = DEFAULT_INTERVAL_S
        if now - node.heard > max(STALE_INTERVALS * interval, STALE_MIN_S):
            return "stale"
        return "online"

    def statuses(self, now: float | None = None) -> list[dict[str, Any]]:
        """The nodes' last statuses by node id, with ``online`` as the online topic says, and
        ``state`` (online, offline or stale), ``stale`` and ``last_seen_s`` as of ``now``."""
        now = self.clock() if now is None else now
        out = []
        for node_id, node in sorted(self._nodes.items()):
            state = self._state(node_id, node, now)
            out.append(
                {
                    **node.status,
                    "online": self._online.get(node_id, node.status["online"]),
                    "state": state,
                    "stale": state == "stale",
                    "last_seen_s": max(0.0, now - node.heard),
                }
            )
        return out

    def view(self, now: float, hide_departed: bool = False) -> FittedTable:
        """The table of every node (a rich renderable that fits the width it is drawn at)."""
        everyone = self.statuses(now)
        rows = [s for s in everyone if not (hide_departed and _departed(s))]
        counts = Counter(s["state"] for s in everyone)
        hidden = len(everyone) - len(rows)
        # The broker last: at a narrow width the counts are what must show.
        title = (
            f"swarm {self.cfg.swarm}: {len(everyone)} node{'' if len(everyone) == 1 else 's'}, "
            + ", ".join(f"{counts[k]} {k}" for k in ("online", "stale", "offline") if counts[k])
            + (f", {hidden} departed hidden" if hidden else "")
            + (f" ({self.note})" if self.note else "")
            + f"; {self.cfg.broker}"
        )
        return FittedTable(title, MONITOR_COLUMNS, [_cells(s) for s in rows])

    def table(self, now: float, width: int = 100, hide_departed: bool = False) -> str:
        """The table as plain text, ``width`` columns wide at most."""
        return render_text(self.view(now, hide_departed), width)

    def to_json(self, now: float | None = None) -> str:
        return json.dumps(self.statuses(now), indent=2, sort_keys=True)


def _departed(s: dict[str, Any]) -> bool:
    return bool(s["state"] == "offline" or (s["stale"] and s["last_seen_s"] > DEPARTED_AFTER_S))


#: The monitor's columns: node, state, step and eval accuracy survive any width; the rest go
#: from the right end of this priority order: last seen, mix, eval loss, train loss, sent,
#: rounds, samples/s, address.
MONITOR_COLUMNS = (
    Column("node", 0, "left", min_width=8, overflow="crop"),
    Column("address", 8, "left", min_width=9),
    Column("state", 0, "left"),
    Column("step", 0),
    Column("train\nloss", 4),
    Column("eval\nloss", 3),
    Column("eval\nacc", 0),
    Column("mix", 2),
    Column("rounds", 6),
    Column("samples\n/s", 7),
    Column("sent", 5),
    Column("last\nseen", 1),
)


def _number(value: Any, spec: str) -> str:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return format(value, spec) if ok else "-"


def _cells(s: dict[str, Any]) -> list[str]:
    budget = f"/{s['step_budget']}" if s["step_budget"] else ""
    evaluated = s.get("eval_step", 0) >= 0 and s["eval_accuracy"] >= 0
    neighbours = [n for n in s["neighbours"] if isinstance(n, dict)]
    mixing = sum(bool(n.get("in_mix")) for n in neighbours)
    return [
        s["node_id"][:12],
        s["address"],
        s["state"],
        f"{s['step']}{budget}",
        _number(s["train_loss"], ".4f"),
        _number(s["eval_loss"], ".4f") if evaluated else "-",
        _number(s["eval_accuracy"], ".3f") if evaluated else "-",
        f"{mixing}/{len(neighbours)}",
        str(s["rounds"]),
        _number(s.get("samples_per_s"), ".0f"),
        fmt_size(s["bytes_sent"]),
        fmt_duration(s["last_seen_s"]),
    ]


async def _collect(cfg: MqttConfig, board: SwarmBoard, on_connect: Callable[[], None]) -> None:
    """Connect, subscribe and feed ``board`` until the connection fails (MqttError)."""
    async with make_client(cfg) as client:
        await client.subscribe(cfg.topic("+", "status"), qos=1)
        await client.subscribe(cfg.topic("+", "online"), qos=1)
        on_connect()
        async for message in client.messages:
            if isinstance(message.payload, bytes | bytearray):
                board.receive(message.topic.value, bytes(message.payload), message.retain)


async def run_monitor(
    cfg: MonitorConfig, out: TextIO = sys.stdout, clock: Callable[[], float] = time.time
) -> int:
    """Show the swarm until interrupted (or once); returns the exit code. ``clock`` is the
    wall clock that ages the statuses."""
    board = SwarmBoard(cfg.mqtt, clock)
    console = Console(file=out, width=cfg.width, soft_wrap=False)
    if cfg.once:
        loop = asyncio.get_running_loop()
        try:
            with contextlib.suppress(TimeoutError):
                # Listen for timeout_s once connected (connecting has the client's deadline).
                async with asyncio.timeout(None) as listening:

                    def listen() -> None:
                        listening.reschedule(loop.time() + cfg.timeout_s)

                    await _collect(cfg.mqtt, board, listen)
        except aiomqtt.MqttError as err:
            print(f"murmur monitor: broker {cfg.mqtt.broker}: {err}", file=sys.stderr)
            return 1
        if cfg.json:
            out.write(board.to_json() + "\n")
        else:
            console.print(board.view(clock(), cfg.hide_departed), crop=True)
        return 0
    live = console.is_terminal and not cfg.json
    drawer = asyncio.create_task(_draw(cfg, board, console, live))
    try:
        # On a live table a log line would tear the frame; the table's title tells of outages.
        await _follow(cfg.mqtt, board, warn=not live)
    finally:
        drawer.cancel()
        await asyncio.gather(drawer, return_exceptions=True)
    return 0


async def _follow(cfg: MqttConfig, board: SwarmBoard, warn: bool = True) -> None:
    """Keep the board fed, reconnecting with back-off (one warning per outage)."""
    backoff = Backoff(cfg.backoff_min_s, cfg.backoff_max_s)
    outage = False

    def connected() -> None:
        nonlocal outage
        backoff.reset()
        outage = False
        board.note = ""

    while True:
        try:
            await _collect(cfg, board, connected)
        except aiomqtt.MqttError as err:
            if not outage and warn:
                log.warning("broker %s: %s; retrying with back-off", cfg.broker, err)
            outage = True
            board.note = f"broker unreachable: {err}"
        await asyncio.sleep(backoff.next())


async def _draw(cfg: MonitorConfig, board: SwarmBoard, console: Console, live: bool) -> None:
    """Redraw in place on a terminal (rich's Live, one frame exactly over the last); into a
    file or a pipe, a table every 5 s at most, since one a second would be a flood."""
    if live:
        with Live(
            console=console,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
            vertical_overflow="ellipsis",
        ) as screen:
            while True:
                screen.update(board.view(board.clock(), cfg.hide_departed), refresh=True)
                await asyncio.sleep(cfg.refresh_s)
    interval_s = max(cfg.refresh_s, 5.0)
    while True:
        if cfg.json:
            console.file.write(json.dumps(board.statuses(), sort_keys=True) + "\n")
            console.file.flush()
        else:
            console.print(board.view(board.clock(), cfg.hide_departed), crop=True)
        await asyncio.sleep(interval_s)
