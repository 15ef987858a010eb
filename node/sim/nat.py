"""Nodes behind NAT in the simulator, by the daemon's rules (node/daemon/dialout.py,
node/transport/grpc.py): a node behind NAT names relays in its member record, so the topology
(gossip/topology.py ``reachable_graph``, through the same MemberView) gives it only neighbours
others can dial; it holds a session to each neighbour and relay, so they reach it directly; any
other member's membership messages for it go through one of its relays, two hops, and are
counted as the relay's. Deltas and snapshots never go through a relay: they travel on the
node's edges, which it opened itself.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Sequence

from gossip.relays import RELAYS

__all__ = ["Reachability"]


class Reachability:
    """Who is behind NAT: ``share`` of the initial nodes (drawn from its own seed, so that
    a run with NAT differs from one without only by it; at least two stay reachable), and each
    joiner with that chance."""

    def __init__(self, share: float, seed: int) -> None:
        self.share = share
        self._rng = random.Random(seed + 3)
        #: Membership bytes relays passed on, over the whole run; and by node behind NAT and
        #: relay.
        self.relayed_bytes = 0
        self.relayed_by: dict[str, Counter[str]] = defaultdict(Counter)

    def relayed(self, node: str, relay: str, nbytes: int) -> None:
        self.relayed_bytes += nbytes
        self.relayed_by[node][relay] += nbytes

    def busiest_relay_share(self) -> float:
        """Of the membership bytes relayed for a node, the share its busiest relay carried,
        averaged over the nodes that had any relayed (1.0: one relay carries all; 0.0: none
        relayed)."""
        shares = [max(c.values()) / total for c in self.relayed_by.values() if (total := c.total())]
        return sum(shares) / len(shares) if shares else 0.0

    def initial(self, count: int) -> frozenset[int]:
        """The indexes of the initial nodes behind NAT."""
        behind = min(round(self.share * count), max(0, count - 2))
        return frozenset(self._rng.sample(range(count), behind))

    def joiner(self) -> bool:
        return self.share > 0 and self._rng.random() < self.share

    def first_relays(self, reachable: Sequence[str]) -> tuple[str, ...]:
        """A node's relays before it has neighbours: members it joined through."""
        return tuple(sorted(self._rng.sample(list(reachable), min(RELAYS, len(reachable)))))
