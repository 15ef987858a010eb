"""Whom a node knows and whom it gossips with: membership (SWIM), the hello exchange of joining
(node/daemon/introductions.py), the swarm's revocation list, and one outbound link per
neighbour, re-derived whenever the member view changes."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from gossip.budget import ByteBudget
from gossip.codec_choice import phase_of
from gossip.codecs import AutoCodec
from gossip.link import round_pace
from gossip.link_codecs import LinkCodecs
from gossip.membership import MemberView
from gossip.messages import PROTOCOL_VERSION, Delta, Hello, Member, TaskFingerprint
from gossip.swim import MemberRecord, Swim, SwimConfig
from gossip.upload_cap import bound_rate
from node.config import GossipConfig
from node.daemon.dialout import DialOut
from node.daemon.gossiper import Gossiper
from node.daemon.introductions import Introductions
from node.daemon.links import LinkConfig, PeerLink
from node.daemon.membership import Membership
from node.daemon.neighbourhood import Neighbourhood
from node.daemon.pacing import Outflow, UploadPacer
from node.daemon.steps import run_on
from node.runtime import Runtime
from node.security.penalties import LogLimiter, RateConfig, RateLimiter, held_back
from node.security.revocation import Revocations, parse_revocations
from node.security.signing import signature_holds
from node.telemetry.events import Counters
from node.transport.base import Reason, Route, Transport

__all__ = ["MemberSigning", "Peers"]

#: How this node signs its own member records (sign, its public key) and checks others'.
MemberSigning = tuple[Callable[[bytes], bytes], bytes, Callable[[MemberRecord], bool]]

log = logging.getLogger(__name__)

#: Members told directly that a node leaves, besides its neighbours (the rest hear it by gossip).
LEAVE_FANOUT = 8


class Peers:
    """Args:
    incarnation: where this node's SWIM incarnation starts (above any earlier run's).
    runtime: the clock, sleep and RNG of membership, joining and the links.
    spawn: runs a background coroutine for the node (and reports its failure).
    on_view_change: called after the member view changed.
    on_links_change: called when a link may have become busy or idle.
    signing: sign this node's member records and drop records whose signature fails.
    budget: the byte budget the links spend (gossip/budget.py; None: none).
    """

    def __init__(
        self,
        node_id: str,
        fingerprint: TaskFingerprint,
        transport: Transport,
        gossiper: Gossiper,
        counters: Counters,
        cfg: GossipConfig,
        swim_cfg: SwimConfig,
        incarnation: int,
        runtime: Runtime,
        spawn: Callable[[Coroutine[Any, Any, None], str], None],
        on_view_change: Callable[[], None],
        on_links_change: Callable[[], None],
        signing: MemberSigning | None = None,
        ca_pem: bytes | None = None,
        on_revocations: Callable[[Revocations], None] = lambda r: None,
        budget: ByteBudget | None = None,
    ) -> None:
        self.node_id = node_id
        self.fingerprint = fingerprint
        self.transport = transport
        self.gossiper = gossiper
        self.counters = counters
        self.cfg = cfg
        self.runtime = runtime
        clock = runtime.clock
        self.link_cfg = LinkConfig(
            queue=cfg.link_queue, window_s=cfg.link_window_s, call_timeout_s=cfg.call_timeout_s
        )
        self.swim = Swim(node_id, "", incarnation, swim_cfg, clock, runtime.fork_rng())
        self.swim.region = cfg.region
        #: The swarm's revocation list as this node knows it (node/security/revocation.py).
        self.revocations = Revocations.none()
        self.ca_pem = ca_pem
        self._on_revocations = on_revocations
        self._spread_left = 0
        # Parsing a list costs a JSON parse and a signature check: a few per source, then one
        # every few seconds; an honest source sends the same list again, which costs nothing.
        self._revocation_rate = RateLimiter(RateConfig(rate=0.2, burst=3), clock)
        self._revocation_log = LogLimiter(clock)
        if signing is not None:
            self.swim.sign, self.swim.public_key, verify = signing
            # A revoked node's records are refused, so it cannot come back into any view.
            self.swim.verify = lambda r: r.node_id not in self.revocations.node_ids and verify(r)
            self.swim.check_signature = signature_holds  # an accuser's, on a suspicion
        self.view = MemberView(self.swim)
        self.membership = Membership(
            self.swim, transport, runtime, self._members_changed, attach=self._attachment
        )
        #: The neighbours and the links to them (the one topology update, shared with the
        #: simulator).
        self.neighbourhood: Neighbourhood[PeerLink] = Neighbourhood(
            self.view,
            cfg,
            self._open_link,
            self._close_link,
            lambda peer: self.membership.send([self.swim.ping(peer.address)]),
            gossiper.apply_neighbours,
        )
        #: Dial-out sessions, for when nobody can dial this node (found at the join).
        self.dialout = DialOut(transport, runtime, lambda: self.swim.address, self._relays_changed)
        #: The hello exchange: joining through an address, and taking joiners.
        self.introductions = Introductions(
            node_id,
            fingerprint,
            transport,
            self.swim,
            self.membership,
            self.dialout,
            cfg,
            runtime,
            self.hello,
            self.adopt_revocations,
        )
        #: The upload cap and the byte budget, shared by every link (None: neither).
        pacer = (
            UploadPacer(cfg.max_upload_rate, clock, runtime.sleep)
            if cfg.max_upload_rate is not None
            else None
        )
        self.outflow = Outflow(pacer, budget) if pacer or budget else None
        self._logged_neighbours: frozenset[str] | None = None  # the last set logged
        self._spawn = spawn
        self._on_view_change = on_view_change
        self._on_links_change = on_links_change
        self._topology_lock = asyncio.Lock()
        #: Under ``--compress auto``, each link's codec from its meter (None: one codec),
        #: scored no faster than the cap and the budget let the node send.
        bound = bound_rate(cfg.max_upload_rate, budget.cfg if budget is not None else None)
        self.codecs = (
            LinkCodecs(gossiper.numel, model_rate=bound) if cfg.codec == AutoCodec.name else None
        )
        #: The node's seconds of local steps between two rounds (the trainer's, once it runs).
        self.compute_s: Callable[[], float] = lambda: 0.0
        #: Whether the node's training is over (``auto`` then scores codecs for settling the
        #: disagreement it left, until the rounds are only heartbeats: gossip/codec_choice.py).
        self.trained: Callable[[], bool] = lambda: False

    def set_address(self, address: str) -> None:
        """Where others reach this node; set once it serves, before it talks to anyone."""
        self.swim.address = address

    @property
    def links(self) -> dict[str, PeerLink]:
        """One outbound link per neighbour, by id."""
        return self.neighbourhood.links

    @property
    def linking(self) -> bool:
        """Whether links open (only once the node has its starting model)."""
        return self.neighbourhood.linking

    def pace(self) -> tuple[bool, frozenset[str]]:
        """Whether a round may begin now, and the links it goes to (gossip/link.py's
        ``round_pace``: with one public copy, none while a link still carries earlier rounds;
        with a copy per link, those not busy)."""
        machines = {peer: link.machine for peer, link in self.links.items()}
        if self.codecs is not None:
            meters = {peer: m.meter for peer, m in machines.items()}
            now = self.runtime.clock.now()
            # Replaced whole: the worker reads them.
            compute_s = self.compute_s()
            phase = phase_of(self.trained(), self.gossiper.mixer.quiet)
            if self.cfg.pace == "link":
                self.gossiper.link_codecs = self.codecs.update(meters, compute_s, now, phase)
            else:
                self.gossiper.round_codec = self.codecs.update_all(meters, compute_s, now, phase)
        return round_pace(machines, self.runtime.clock.now(), self.cfg.pace == "link")

    def offer(self, delta: Delta | Mapping[str, Delta]) -> None:
        """A round's delta for every link, or (a copy per link) each link's own."""
        if isinstance(delta, Delta):
            for link in self.links.values():
                link.offer(delta)
            return
        for peer, own in delta.items():
            carrier = self.links.get(peer)
            if carrier is not None:  # else it closed while the round was made
                carrier.offer(own)

    async def leave(self) -> None:
        """Tell the neighbours first, then a few others, that this node leaves."""
        await self.membership.leave(list(self.links), LEAVE_FANOUT)

    async def set_paused(self, paused: bool) -> None:
        """Pause (or resume) this node's part in the topology: its record says so at a new
        incarnation, the neighbours hear it at once (a ping carries it) and everyone else as
        SWIM spreads it; every member's graph then leaves it out (or takes it back), so its
        neighbours' weights renormalise over the others. Membership goes on either way."""
        if not self.swim.set_paused(paused):
            return
        told = [m.address for m in map(self.view.get, self.neighbourhood.neighbours) if m]
        self.membership.send([self.swim.ping(address) for address in told])
        self.membership.poke()
        await self.update_topology()

    async def stop(self) -> None:
        await self.dialout.stop()
        await self.membership.stop()
        for link in self.links.values():
            await link.stop()

    # -- joining (node/daemon/introductions.py) ----------------------------------------------

    def hello(self) -> Hello:
        """What this node says in a hello: its record, its view and its revocation list."""
        records = tuple(self.swim.records())
        blob = self.revocations.blob
        return Hello(PROTOCOL_VERSION, self.swim.me, self.fingerprint, records, blob)

    # -- revocation ---------------------------------------------------------------------------

    def adopt_revocations(self, blob: bytes, source: str) -> bool:
        """Take a revocation list newer than ours and signed by our CA; returns whether it did.

        The revoked nodes leave the view at once (the membership task then re-derives the
        neighbours and closes their links), and this node passes the list on with its next
        few membership messages.
        """
        if not blob or self.ca_pem is None or blob == self.revocations.blob:
            return False
        if not self._revocation_rate.allow(source):
            return False
        try:
            new = parse_revocations(blob, self.ca_pem)
        except ValueError as err:
            self.counters.rejected[str(Reason.BAD_REVOCATIONS)] += 1
            if (held := self._revocation_log.allow(source)) is not None:
                log.warning("ignored a revocation list from %s: %s%s", source, err, held_back(held))
            return False
        if new.version <= self.revocations.version:
            return False
        self.revocations = new
        self._spread_left = self.swim.cfg.retransmit_limit(len(self.view))
        log.warning(
            "revocation list v%d (from %s): %d node(s) revoked: %s",
            new.version,
            source,
            len(new.node_ids),
            " ".join(sorted(i[:8] for i in new.node_ids)[:20])
            + (" ..." if len(new.node_ids) > 20 else ""),
        )
        for node_id in new.node_ids:
            self.swim.expel(node_id)
        self.membership.poke()
        self._on_revocations(new)
        return True

    def _attachment(self) -> bytes:
        if self._spread_left <= 0:
            return b""
        self._spread_left -= 1
        return self.revocations.blob

    def _relays_changed(self, relays: tuple[str, ...]) -> None:
        if self.swim.set_relays(relays):
            self.membership.poke()  # the new record spreads at the head of every message

    def _follow_view(self) -> None:
        """Routes to the members nobody can dial, and (behind NAT) sessions to the
        neighbours, which the topology chose among the members others can dial."""
        records = self.swim.live_members()
        self.transport.set_routes(
            {
                r.address: Route(r.node_id, r.relays)
                for r in records
                if r.relays and r.node_id != self.node_id
            }
        )
        if self.dialout.active:
            addresses = {m.address for m in map(self.view.get, self.neighbourhood.neighbours) if m}
            self.dialout.want(addresses)

    async def _members_changed(self, changes: list[MemberRecord]) -> None:
        for r in changes:
            log.info("member %s at %s is %s", r.node_id[:8], r.address, r.status)
        await self.update_topology()
        self._on_view_change()

    # -- neighbours ---------------------------------------------------------------------------

    async def start_links(self) -> None:
        async with self._topology_lock:
            await run_on(self.neighbourhood.start_linking(), self.gossiper.run)
        self._topology_changed()

    async def update_topology(self) -> None:
        """Derive this node's neighbours from the view; open and close links to match."""
        async with self._topology_lock:
            await run_on(self.neighbourhood.update(), self.gossiper.run)
        self._topology_changed()

    def _topology_changed(self) -> None:
        self._follow_view()
        self._on_links_change()
        mine = self.neighbourhood.neighbours
        if mine != self._logged_neighbours:  # the topology is recomputed at every change
            self._logged_neighbours = mine
            log.info(
                "node %s neighbours (%s): %s",
                self.node_id[:8],
                self.cfg.topology,
                " ".join(sorted(j[:8] for j in mine)) or "none",
            )

    def _open_link(self, peer: Member) -> PeerLink:
        link = PeerLink(
            peer,
            self.transport,
            functools.partial(self.gossiper.snapshot, peer.node_id),
            self.link_cfg,
            self.counters,
            self.runtime,
            on_change=self._on_links_change,
            outflow=self.outflow,
            snapshot_nbytes=4 * self.gossiper.numel,
        )
        link.start()
        return link

    def _close_link(self, link: PeerLink) -> None:
        # Stopped in the background: a link to a dead peer may take a while to let go of its
        # call, and the topology must not wait for it.
        self._spawn(link.stop(), f"unlink-{link.peer.node_id[:8]}")
