"""The MQTT client of a node: its status for fleet dashboards, and discovery of its peers.

The topics and payloads are in :mod:`node.telemetry.mqtt_messages`. Every message is retained, so a
dashboard, or a node, that connects later learns the whole swarm at once. With discovery, a node
with nothing else to join through waits (a few seconds at most) for the announcements the broker
holds: its own announcement coming back marks their end, since the broker sends the retained
messages of a subscription before anything published after it. From then on every announcement
is passed to the node, which joins the members it does not know yet, so two parts of a swarm
that started apart merge.

The broker is optional: an outage costs one warning and reconnections with exponential back-off
and jitter, and nothing here raises into the node. The client id is ``murmur-`` and the start of
the node id, so a node restarted on its state dir takes over its old session (and the broker
publishes the old session's will before the new ``true``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiomqtt

from node.runtime import Runtime
from node.telemetry.mqtt_messages import OFFLINE, ONLINE, MqttConfig, parse_address, status_payload
from node.telemetry.status import NodeStatus

__all__ = ["Backoff", "MqttBridge", "make_client"]

log = logging.getLogger(__name__)


def make_client(
    cfg: MqttConfig, identifier: str | None = None, will: aiomqtt.Will | None = None
) -> aiomqtt.Client:
    """A client for ``cfg``'s broker (connect by entering it; a fresh one for every try)."""
    b = cfg.broker
    return aiomqtt.Client(
        b.host,
        b.port,
        username=b.username,
        password=b.password,
        identifier=identifier,
        will=will,
        keepalive=cfg.keepalive_s,
        timeout=cfg.timeout_s,
    )


class Backoff:
    """Reconnection delays: doubling from ``min_s`` to ``max_s``, each scaled by a random
    factor in [0.5, 1.5) so that a fleet that lost its broker together does not come back in
    lockstep."""

    def __init__(self, min_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self.min_s = min_s
        self.max_s = max_s
        self._rng = rng or random.Random()
        self._delay = min_s

    def next(self) -> float:
        delay = self._delay
        self._delay = min(2 * delay, self.max_s)
        return min(self.max_s, delay * (0.5 + self._rng.random()))

    def reset(self) -> None:
        self._delay = self.min_s


@dataclass
class _Announcement:
    address: str | None = None  # None: never announced, or cleared
    online: bool = False


def _payload_bytes(payload: object) -> bytes | None:
    return bytes(payload) if isinstance(payload, bytes | bytearray) else None


class MqttBridge:
    """A node's link to an MQTT broker: its status every ``interval_s``, its online flag and
    last will, and with discovery its address and the members announced by others.

    Failures stay here: the bridge logs and reconnects, and never raises into the node.

    Args:
        cfg: the broker and topics.
        node_id, address: this node's.
        status: the node's status now.
        join: called with the id and address of each announced member, once :meth:`follow`
            was called; it decides whether to join (and should not raise).
        runtime: times outages and draws the reconnection back-off's jitter.
        clock: wall-clock time for the statuses' ``time``.
    """

    def __init__(
        self,
        cfg: MqttConfig,
        node_id: str,
        address: str,
        status: Callable[[], Awaitable[NodeStatus]],
        runtime: Runtime,
        join: Callable[[str, str], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.node_id = node_id
        self.address = address
        self._status = status
        self._join = join
        self._clock = clock
        self._monotonic = runtime.clock
        self.connected = False
        self._backoff = Backoff(cfg.backoff_min_s, cfg.backoff_max_s, runtime.fork_rng())
        self._outage_since: float | None = None
        self._stopping = asyncio.Event()
        #: Set once the announcements the broker held have arrived, or the broker failed us.
        self._synced = asyncio.Event()
        self._announced: dict[str, _Announcement] = {}
        self._following = False
        self._joins: dict[str, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Connect and publish in the background, until :meth:`stop`."""
        self._task = asyncio.create_task(self._run(), name="mqtt")

    async def stop(self) -> None:
        """Say goodbye (offline; address cleared) and disconnect, within ``timeout_s``; at
        once if the broker is not there."""
        self._stopping.set()
        for task in self._joins.values():
            task.cancel()
        await asyncio.gather(*self._joins.values(), return_exceptions=True)
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.cfg.timeout_s):
                await asyncio.shield(self._task)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def announced(self) -> list[str]:
        """Addresses of the live members the broker announced when this node connected.

        Waits for the first connection, ``discovery_wait_s`` at most; empty when the broker is
        not there or nobody was announced.
        """
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._synced.wait(), self.cfg.discovery_wait_s)
        return [a.address for a in self._announced.values() if a.address and a.online]

    def follow(self) -> None:
        """From now on, pass every live member announced (and those already) to ``join``."""
        self._following = True
        for node_id in list(self._announced):
            self._maybe_join(node_id)

    # -- connection ---------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self._session()
                return
            except (aiomqtt.MqttError, OSError) as err:
                self._lost(f"{err}")
            except Exception as err:  # a bug here must not stop the node: it keeps training
                self._lost(f"{type(err).__name__}: {err}", exc_info=True)
            delay = self._backoff.next()
            log.debug("MQTT: next try in %.1f s", delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)

    def _lost(self, reason: str, exc_info: bool = False) -> None:
        self.connected = False
        self._synced.set()  # nobody should wait for announcements from a broker that is not there
        if self._outage_since is None:
            self._outage_since = self._monotonic.now()
            log.warning(
                "MQTT broker %s: %s; telemetry paused, retrying with back-off (training goes on)",
                self.cfg.broker,
                reason,
                exc_info=exc_info,
            )
        else:
            log.debug("MQTT broker %s still unreachable: %s", self.cfg.broker, reason)

    async def _session(self) -> None:
        """One connection: announce, publish until stopped, say goodbye. Raises on failure."""
        cfg = self.cfg
        online = cfg.topic(self.node_id, "online")
        will = aiomqtt.Will(online, OFFLINE, qos=1, retain=True)
        async with make_client(cfg, f"murmur-{self.node_id[:16]}", will) as client:
            try:
                if cfg.discovery:
                    await client.subscribe(cfg.topic("+", "address"), qos=1)
                    await client.subscribe(cfg.topic("+", "online"), qos=1)
                await client.publish(online, ONLINE, qos=1, retain=True)
                if cfg.discovery:
                    address = cfg.topic(self.node_id, "address")
                    await client.publish(address, self.address.encode(), qos=1, retain=True)
                else:
                    self._synced.set()
                # Only now is the outage over: a broker that takes the connection and then
                # refuses the rest keeps us on the back-off, with no warning per attempt.
                self._connected()
                await self._serve(client)
            finally:
                self.connected = False

    def _connected(self) -> None:
        self.connected = True
        self._backoff.reset()
        if self._outage_since is not None:
            log.info(
                "MQTT broker %s is back after %.1f s",
                self.cfg.broker,
                self._monotonic.now() - self._outage_since,
            )
            self._outage_since = None
        else:
            topics = self.cfg.topic(self.node_id, "#")
            log.info("MQTT: publishing to %s under %s", self.cfg.broker, topics)

    async def _serve(self, client: aiomqtt.Client) -> None:
        # The reader also notices a lost connection at once (a publish only on its deadline).
        reader = asyncio.create_task(self._read(client), name="mqtt-read")
        writer = asyncio.create_task(self._publish_statuses(client), name="mqtt-write")
        try:
            done, _ = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reader, writer):
                task.cancel()
            await asyncio.gather(reader, writer, return_exceptions=True)
        for task in done:
            task.result()  # raises what ended the connection
        if reader in done:
            raise aiomqtt.MqttError("the broker closed the connection")
        await self._goodbye(client)

    async def _publish_statuses(self, client: aiomqtt.Client) -> None:
        while not self._stopping.is_set():
            await self._publish_status(client, online=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.cfg.interval_s)

    async def _publish_status(self, client: aiomqtt.Client, online: bool) -> None:
        try:
            status = await self._status()
        except Exception:  # the node is shutting down, say: skip this one
            log.debug("MQTT: no status to publish", exc_info=True)
            return
        payload = status_payload(status, online, self._clock(), self.cfg.interval_s)
        await client.publish(self.cfg.topic(self.node_id, "status"), payload, qos=1, retain=True)

    async def _goodbye(self, client: aiomqtt.Client) -> None:
        """A clean stop: offline first (the authority), then what else goes stale."""
        await client.publish(self.cfg.topic(self.node_id, "online"), OFFLINE, qos=1, retain=True)
        if self.cfg.discovery:
            address = self.cfg.topic(self.node_id, "address")
            await client.publish(address, b"", qos=1, retain=True)
        await self._publish_status(client, online=False)
        log.info("MQTT: said goodbye to %s", self.cfg.broker)

    # -- discovery ----------------------------------------------------------------------------

    async def _read(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            payload = _payload_bytes(message.payload)
            if payload is not None:
                self._receive(message.topic.value, payload, message.retain)

    def _receive(self, topic: str, payload: bytes, retained: bool) -> None:
        parsed = self.cfg.parse_topic(topic)
        if parsed is None:
            return
        node_id, kind = parsed
        if node_id == self.node_id:
            if kind == "address" and not retained:
                # Our own announcement, forwarded live: every retained one came before it.
                self._synced.set()
            return
        entry = self._announced.setdefault(node_id, _Announcement())
        if kind == "address":
            address = parse_address(payload) if payload else None
            if payload and address is None:
                log.debug("MQTT: ignoring a bad address for %s: %r", node_id[:8], payload[:80])
                return
            entry.address = address
        elif kind == "online":
            if payload not in (ONLINE, OFFLINE):
                log.debug("MQTT: ignoring a bad online flag for %s: %r", node_id[:8], payload[:80])
                return
            entry.online = payload == ONLINE
        self._maybe_join(node_id)

    def _maybe_join(self, node_id: str) -> None:
        entry = self._announced.get(node_id)
        if (
            not self._following
            or self._join is None
            or self._stopping.is_set()
            or entry is None
            or entry.address is None
            or not entry.online
            or node_id in self._joins
        ):
            return
        task = asyncio.create_task(self._join_one(node_id, entry.address), name="mqtt-join")
        self._joins[node_id] = task
        task.add_done_callback(lambda _: self._joins.pop(node_id, None))

    async def _join_one(self, node_id: str, address: str) -> None:
        assert self._join is not None
        try:
            await self._join(node_id, address)
        except Exception:  # the node's join should not raise; if it does, it is only logged
            log.warning("MQTT: joining %s at %s failed", node_id[:8], address, exc_info=True)
