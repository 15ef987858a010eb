"""Which relays a node that nobody can dial names in its member record: the same rule in the
daemon (node/daemon/dialout.py) and the simulator (node/sim/nat.py)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

__all__ = ["RELAYS", "choose_relays"]

#: Relays a record names (each a member holding a session from the node).
RELAYS = 2


def choose_relays(current: Sequence[str], up: Collection[str]) -> tuple[str, ...]:
    """Those named before that still hold a session from the node, then others that do, by
    address (``up``: the members it holds sessions to and trusts); sorted. Empty when none is
    up."""
    keep = [r for r in current if r in up]
    more = sorted(set(up) - set(keep))
    return tuple(sorted([*keep, *more][:RELAYS]))
