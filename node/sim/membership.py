"""A simulated node's membership: SWIM over the modelled network, the live members as its view
has them, and the relays it names when nobody can dial it.

The counterpart of the daemon's node/daemon/membership.py (SWIM's messages and timer) and of
node/daemon/dialout.py (the relays a node behind NAT names, probes and holds sessions to).
:class:`gossip.swim.Swim` decides, as in the daemon; here its messages travel the modelled
network (a member behind NAT is reached through one of its relays, node/sim/nat.py), and its
timer and the relays' probes are events on the simulation's queue.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Protocol

from gossip.membership import MemberView
from gossip.messages import PROTOCOL_VERSION
from gossip.relays import choose_relays
from gossip.swim import MemberRecord, Outgoing, Swim, SwimMessage
from node.daemon.dialout import PROBE_EVERY_S, PROBE_MISSES, PROBE_TIMEOUT_S
from node.sim.world import World
from node.transport import wire_sizes

__all__ = ["FAKE_PUBLIC_KEY", "FAKE_SIGNATURE", "MemberOwner", "SimMembership"]

#: The sizes of a P-256 public key (DER SubjectPublicKeyInfo) and of an ECDSA signature (DER).
FAKE_PUBLIC_KEY = bytes(91)
FAKE_SIGNATURE = bytes(71)


class MemberOwner(Protocol):
    """The simulated node whose membership it is (node/sim/node.py ``SimNode``)."""

    @property
    def sim(self) -> World: ...

    @property
    def node_id(self) -> str: ...

    @property
    def address(self) -> str: ...

    @property
    def alive(self) -> bool: ...

    @property
    def neighbours(self) -> frozenset[str]:
        """The ids of the node's neighbours."""
        ...

    def update_topology(self) -> None:
        """The view changed: derive the neighbours again, and follow the view's relays."""
        ...


class SimMembership:
    """Args:
    owner: the node.
    incarnation: where its SWIM incarnation starts.
    rng: SWIM's randomness (probe order, helpers).
    """

    def __init__(self, owner: MemberOwner, incarnation: int, rng: random.Random) -> None:
        self.owner = owner
        self.sim = owner.sim
        self.node_id = owner.node_id
        self.address = owner.address
        self.swim = Swim(
            owner.node_id,
            owner.address,
            incarnation,
            self.sim.cfg.membership,
            self.sim.clock,
            rng,
            # Records carry a key and a signature of a real node's sizes, so that membership
            # messages weigh what they do on the wire; nothing checks them (no crypto cost).
            sign=lambda claim: FAKE_SIGNATURE,
            public_key=FAKE_PUBLIC_KEY,
        )
        self.view = MemberView(self.swim)
        self.swim_bytes = 0
        #: Nobody can dial this node (node/sim/nat.py): it names relays.
        self.behind_nat = False
        #: Addresses of members nobody can dial -> their relays, from this node's view.
        self.routes: dict[str, tuple[str, ...]] = {}
        self._misses: dict[str, int] = {}
        self._failed: set[str] = set()
        #: The live members' addresses (by id, and as a set), as this node's view has them.
        self._addresses: dict[str, str] = {}
        self._live: set[str] = set()

    # -- SWIM's messages and timer ------------------------------------------------------------

    def send(self, outgoing: Iterable[Outgoing]) -> None:
        sim = self.sim
        for out in outgoing:
            message = out.message
            nbytes = wire_sizes.swim_nbytes(message, PROTOCOL_VERSION)
            self.swim_bytes += nbytes
            relays = self.routes.get(out.address)
            if relays and not sim.holds_session(out.address, self.address):
                sim.relay_swim(self.address, out.address, relays, nbytes, message)
                continue
            sim.network.send(
                self.address, out.address, nbytes, sim.swim_delivery(out.address, message)
            )

    def receive(self, message: SwimMessage) -> None:
        self.send(self.swim.receive(message))
        self.after_swim()

    def tick(self) -> None:
        if self.swim.next_deadline() <= self.sim.clock.now():
            self.send(self.swim.tick())
        self.after_swim()

    def after_swim(self) -> None:
        """React to what changed (the daemon's membership task), and keep the timer set."""
        if not self.owner.alive:
            return
        changes = self.swim.drain_changes()
        if changes:
            for record in changes:
                self._note(record)
            self.owner.update_topology()
        self.sim.events.timer(self.address, self.swim.next_deadline(), self.tick)

    # -- the view -----------------------------------------------------------------------------

    def read_view(self) -> None:
        """The live members' addresses and the routes to those behind NAT, from the whole view
        (then kept up to date from each change: a thousand nodes each rereading a view of a
        thousand on every change is what a simulation of them cannot afford)."""
        self._addresses.clear()
        self._live.clear()
        self.routes.clear()
        for record in self.swim.live_members():
            self._note(record)

    def _note(self, record: MemberRecord) -> None:
        if record.node_id == self.node_id:
            return
        old = self._addresses.pop(record.node_id, None)
        if old is not None:
            self._live.discard(old)
            self.routes.pop(old, None)
        if record.live:
            self._addresses[record.node_id] = record.address
            self._live.add(record.address)
            if record.relays:
                self.routes[record.address] = record.relays

    def follow_view(self) -> None:
        """Name relays among the live members this node holds sessions to (behind NAT; the
        daemon's Peers._follow_view)."""
        if self.behind_nat:
            relays = choose_relays(self.swim.relays, self.sessions() & self._live)
            if relays:
                self.swim.set_relays(relays)

    # -- behind NAT ---------------------------------------------------------------------------

    def go_behind_nat(self, relays: tuple[str, ...]) -> None:
        """From now on nobody can dial this node: it names ``relays`` (members it joined
        through), then its neighbours as they come, and probes the relays it names."""
        self.behind_nat = True
        self.swim.set_relays(relays)
        self.sim.events.after(PROBE_EVERY_S, self._probe_relays)

    def _probe_relays(self) -> None:
        """The daemon's probes (node/daemon/dialout.py): one through each relay; a relay
        whose host is gone (a crash here is silent) fails it, known a timeout later."""
        if not self.owner.alive:
            return
        gone = [r for r in self.swim.relays if self.sim.live_node(r) is None]
        for relay in self.swim.relays:
            if relay not in gone:
                self._misses.pop(relay, None)

        def verdict() -> None:
            for relay in gone:
                self._misses[relay] = misses = self._misses.get(relay, 0) + 1
                if misses >= PROBE_MISSES:
                    self._failed.add(relay)
            if gone and self.owner.alive:
                self.follow_view()

        self.sim.events.after(PROBE_TIMEOUT_S, verdict)
        self.sim.events.after(PROBE_EVERY_S, self._probe_relays)

    def sessions(self) -> set[str]:
        """The members this node holds dial-out sessions to and trusts (behind NAT): its
        neighbours and the relays it names, less those whose probes failed."""
        if not self.behind_nat:
            return set()
        near = {m.address for m in map(self.view.get, self.owner.neighbours) if m}
        return (near | set(self.swim.relays)) - self._failed
