"""``murmur monitor``: every node of a swarm, live, from the MQTT broker the nodes report to.

It subscribes to the swarm's ``status`` and ``online`` topics (see :mod:`node.mqtt`); since both
are retained, it shows every node that ever reported as soon as it connects, the departed ones
offline. ``--once`` collects for a while and prints once, for scripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

import aiomqtt

from node.mqtt import Backoff, make_client
from node.mqtt_messages import OFFLINE, ONLINE, MqttConfig, parse_status

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
    """

    mqtt: MqttConfig
    once: bool = False
    timeout_s: float = 3.0
    json: bool = False
    refresh_s: float = 1.0


class SwarmBoard:
    """The last status of each node the broker told of, and its last online flag (which wins
    over the status's own ``online``: a killed node's retained status still says true)."""

    def __init__(self, cfg: MqttConfig) -> None:
        self.cfg = cfg
        self._statuses: dict[str, dict[str, Any]] = {}
        self._online: dict[str, bool] = {}
        #: Shown in the table's first line: why what it shows may be old.
        self.note = ""

    def receive(self, topic: str, payload: bytes) -> None:
        parsed = self.cfg.parse_topic(topic)
        if parsed is None:
            return
        node_id, kind = parsed
        if kind == "online" and payload in (ONLINE, OFFLINE):
            self._online[node_id] = payload == ONLINE
        elif kind == "status" and not payload:  # a retained status cleared by hand
            self._statuses.pop(node_id, None)
        elif kind == "status":
            status = parse_status(payload)
            if status is None or status["node_id"] != node_id:
                log.debug("ignoring a bad status on %s", topic)
                return
            self._statuses[node_id] = status

    def statuses(self) -> list[dict[str, Any]]:
        """The nodes' last statuses by node id, ``online`` as the online topic says."""
        return [
            {**s, "online": self._online.get(node_id, s["online"])}
            for node_id, s in sorted(self._statuses.items())
        ]

    def table(self, now: float) -> str:
        rows = self.statuses()
        online = sum(s["online"] for s in rows)
        note = f" ({self.note})" if self.note else ""
        lines = [
            f"swarm {self.cfg.swarm} on {self.cfg.broker}: {len(rows)} nodes, {online} online"
            + note,
            f"{'node':12} {'address':21} {'online':6} {'step':>12} {'loss':>8} {'accuracy':>8} "
            f"{'nbrs':>4} {'sent':>10} {'last seen':>9}",
        ]
        for s in rows:
            budget = f"/{s['step_budget']}" if s["step_budget"] else ""
            loss = f"{s['loss']:.4f}" if s["loss"] is not None else "-"
            acc = f"{s['accuracy']:.3f}" if s["accuracy"] >= 0 else "-"
            seen = f"{max(0.0, now - s['time']):.0f}s ago"
            lines.append(
                f"{s['node_id'][:12]:12} {s['address']:21} {'yes' if s['online'] else 'no':6} "
                f"{str(s['step']) + budget:>12} {loss:>8} {acc:>8} {len(s['neighbours']):>4} "
                f"{_mib(s['bytes_sent']):>10} {seen:>9}"
            )
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(self.statuses(), indent=2, sort_keys=True)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


class _Screen:
    """Redraws in place on a terminal; one table after another otherwise."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self._lines = 0

    def show(self, text: str) -> None:
        if self.tty and self._lines:
            self.out.write(f"\x1b[{self._lines}F\x1b[J")
        self.out.write(text + "\n")
        self.out.flush()
        self._lines = text.count("\n") + 1


async def _collect(cfg: MqttConfig, board: SwarmBoard, on_connect: Callable[[], None]) -> None:
    """Connect, subscribe and feed ``board`` until the connection fails (MqttError)."""
    async with make_client(cfg) as client:
        await client.subscribe(cfg.topic("+", "status"), qos=1)
        await client.subscribe(cfg.topic("+", "online"), qos=1)
        on_connect()
        async for message in client.messages:
            if isinstance(message.payload, bytes | bytearray):
                board.receive(message.topic.value, bytes(message.payload))


async def run_monitor(cfg: MonitorConfig, out: TextIO = sys.stdout) -> int:
    """Show the swarm until interrupted (or once); returns the exit code."""
    board = SwarmBoard(cfg.mqtt)
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
        out.write((board.to_json() if cfg.json else board.table(time.time())) + "\n")
        return 0
    drawer = asyncio.create_task(_draw(cfg, board, _Screen(out)))
    try:
        await _follow(cfg.mqtt, board)
    finally:
        drawer.cancel()
        await asyncio.gather(drawer, return_exceptions=True)
    return 0


async def _follow(cfg: MqttConfig, board: SwarmBoard) -> None:
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
            if not outage:
                log.warning("broker %s: %s; retrying with back-off", cfg.broker, err)
            outage = True
            board.note = f"broker unreachable: {err}"
        await asyncio.sleep(backoff.next())


async def _draw(cfg: MonitorConfig, board: SwarmBoard, screen: _Screen) -> None:
    # Into a file or a pipe, a table a second would be a flood.
    interval_s = cfg.refresh_s if screen.tty else max(cfg.refresh_s, 5.0)
    while True:
        if cfg.json:
            screen.out.write(json.dumps(board.statuses(), sort_keys=True) + "\n")
            screen.out.flush()
        else:
            screen.show(board.table(time.time()))
        await asyncio.sleep(interval_s)
