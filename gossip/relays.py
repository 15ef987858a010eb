"""Which relays a node that nobody can dial names in its member record, and in which order
another member tries them: the same rules in the daemon (node/daemon/dialout.py,
node/transport/grpc.py) and the simulator (node/sim/nat.py, node/sim/swarm.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence

__all__ = ["RELAYS", "choose_relays", "relay_order"]

#: Relays a record names (each a member holding a session from the node).
RELAYS = 2


def choose_relays(current: Sequence[str], up: Collection[str]) -> tuple[str, ...]:
    """Those named before that still hold a session from the node, then others that do, by
    address (``up``: the members it holds sessions to and trusts); sorted. Empty when none is
    up."""
    keep = [r for r in current if r in up]
    more = sorted(set(up) - set(keep))
    return tuple(sorted([*keep, *more][:RELAYS]))


def relay_order(relays: Sequence[str], to: str, last: str | None, salt: bytes) -> list[str]:
    """The order in which a member tries ``to``'s relays: the one that passed its last call on
    first, then the others by a hash of the member's ``salt``, the node and the relay, so that
    each member has an order of its own (rendezvous hashing: the order of two relays does not
    change when a third comes or goes)."""

    def rank(relay: str) -> bytes:
        return hashlib.blake2b(salt + f"\0{to}\0{relay}".encode(), digest_size=8).digest()

    return sorted(relays, key=lambda r: (r != last, rank(r)))
