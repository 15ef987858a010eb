"""Whom a node knows and whom it gossips with: the member view, introductions, joining, and one
outbound link per neighbour, re-derived whenever the view changes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from gossip.membership import MemberView
from gossip.messages import PROTOCOL_VERSION, Delta, Hello, Member, TaskFingerprint
from node.config import GossipConfig
from node.gossiper import Gossiper
from node.links import LinkConfig, PeerLink
from node.telemetry import Counters
from node.transport.base import Reason, Rejected, Transport, Unreachable

__all__ = ["JoinError", "Peers"]

log = logging.getLogger(__name__)

#: Refusals that mean "not now" rather than "never": retry the join.
_RETRYABLE = frozenset({Reason.SHUTTING_DOWN, Reason.NOT_READY})


class JoinError(RuntimeError):
    """The node could not join the swarm (refused, or nobody answered in time)."""


class Peers:
    """Args:
    spawn: runs a background coroutine for the node (and reports its failure).
    on_view_change: called after the member view changed.
    on_links_change: called when a link may have become busy or idle.
    """

    def __init__(
        self,
        node_id: str,
        fingerprint: TaskFingerprint,
        transport: Transport,
        gossiper: Gossiper,
        counters: Counters,
        cfg: GossipConfig,
        spawn: Callable[[Coroutine[Any, Any, None], str], None],
        on_view_change: Callable[[], None],
        on_links_change: Callable[[], None],
    ) -> None:
        self.node_id = node_id
        self.fingerprint = fingerprint
        self.transport = transport
        self.gossiper = gossiper
        self.counters = counters
        self.cfg = cfg
        self.link_cfg = LinkConfig(queue=cfg.link_queue, call_timeout_s=cfg.call_timeout_s)
        self.view = MemberView(Member(node_id, ""))
        self.links: dict[str, PeerLink] = {}
        self._spawn = spawn
        self._on_view_change = on_view_change
        self._on_links_change = on_links_change
        self._introduced: set[str] = set()
        self._topology_lock = asyncio.Lock()

    def set_address(self, address: str) -> None:
        """Where others reach this node; set once it serves, before it talks to anyone."""
        self.view = MemberView(Member(self.node_id, address))

    @property
    def busy(self) -> bool:
        """Whether some healthy link still carries earlier rounds."""
        return any(link.busy for link in self.links.values())

    def offer(self, delta: Delta) -> None:
        for link in self.links.values():
            link.offer(delta)

    async def stop(self) -> None:
        for link in self.links.values():
            await link.stop()

    # -- introductions ------------------------------------------------------------------------

    def hello(self) -> Hello:
        return Hello(PROTOCOL_VERSION, self.view.me, self.fingerprint, self.view.members)

    async def introduce(self, address: str) -> Hello:
        """Say hello to ``address`` and learn its members. Raises Rejected or Unreachable."""
        reply = await self.transport.call_hello(address, self.hello(), self.cfg.call_timeout_s)
        if reply.protocol_version != PROTOCOL_VERSION:
            raise Rejected(Reason.PROTOCOL_VERSION, f"{address} speaks {reply.protocol_version}")
        differences = self.fingerprint.differences(reply.fingerprint)
        if differences:
            raise Rejected(Reason.FINGERPRINT, "; ".join(differences))
        self._introduced.add(reply.self_.node_id)
        await self.learn([reply.self_, *reply.members])
        return reply

    async def learn(self, members: Iterable[Member], introduced: Member | None = None) -> None:
        """Merge members into the view, introduce ourselves to new ones, re-derive neighbours.

        ``introduced`` already knows us (it just said hello).
        """
        if introduced is not None:
            self._introduced.add(introduced.node_id)
        new = self.view.merge(members)
        if not new:
            return
        log.info("node %s knows %d members", self.node_id[:8], len(self.view))
        for m in new:
            if m.node_id not in self._introduced:
                self._introduced.add(m.node_id)
                self._spawn(self._introduce_quietly(m), f"hello-{m.node_id[:8]}")
        await self.update_topology()
        self._on_view_change()

    async def _introduce_quietly(self, member: Member) -> None:
        try:
            await self.introduce(member.address)
        except (Rejected, Unreachable) as err:
            log.warning("could not introduce ourselves to %s: %s", member.node_id[:8], err)

    async def _reintroduce(self, member: Member) -> None:
        await self.introduce(member.address)

    async def join(self, addresses: Iterable[str], timeout_s: float) -> None:
        """Introduce ourselves through each address, retrying silent ones until ``timeout_s``.

        Raises:
            JoinError: one address refused us (the task differs, say), or none answered.
        """
        deadline = time.monotonic() + timeout_s

        async def through(address: str) -> None:
            delay = 0.1
            while True:
                try:
                    await self.introduce(address)
                    return
                except Rejected as err:
                    if err.reason not in _RETRYABLE:
                        raise JoinError(f"{address} refused us: {err}") from err
                except Unreachable as err:
                    if time.monotonic() > deadline:
                        raise JoinError(f"{address} did not answer: {err}") from err
                log.info("waiting for %s to answer", address)
                await asyncio.sleep(delay)
                delay = min(2 * delay, 2.0)

        results = await asyncio.gather(*(through(a) for a in addresses), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        refused = [e for e in errors if isinstance(e.__cause__, Rejected)]
        if refused or len(errors) == len(results):
            raise (refused or errors)[0]
        for err in errors:
            log.warning("join: %s", err)

    # -- neighbours ---------------------------------------------------------------------------

    async def update_topology(self) -> None:
        """Derive this node's neighbours from the view; open and close links to match."""
        async with self._topology_lock:
            graph = self.view.graph(self.cfg.topology, degree=self.cfg.degree, seed=self.cfg.seed)
            me = self.node_id
            mine = graph.neighbours(me)
            weights = {j: 1.0 / (1 + max(graph.degree(me), graph.degree(j))) for j in mine}
            await self.gossiper.set_neighbours(weights)
            for peer_id in list(self.links):
                if peer_id not in mine or self.links[peer_id].peer != self.view.get(peer_id):
                    await self.links.pop(peer_id).stop()
            for peer_id in sorted(mine - self.links.keys()):
                peer = self.view.get(peer_id)
                assert peer is not None
                link = PeerLink(
                    peer,
                    self.transport,
                    self.gossiper.snapshot,
                    self.link_cfg,
                    self.counters,
                    on_unknown=self._reintroduce,
                    on_change=self._on_links_change,
                )
                self.links[peer_id] = link
                link.start()
            self._on_links_change()
            log.info(
                "node %s neighbours (%s): %s",
                me[:8],
                self.cfg.topology,
                " ".join(sorted(j[:8] for j in mine)),
            )
