"""Random cycles through the members, each in the order of a hash of (seed, cycle, id): the
expander's and the sparse random-regular graph's edges (gossip/topology.py).

Every member derives the graph from its view, so a graph must change little when the members
do. A cycle in hash order does: a member that comes or goes takes one edge of it and gives two
(or takes two and gives one). The union of a few random cycles is an expander, as random
regular graphs are. Where two cycles pass through the same pair it is one edge, so a few nodes
have fewer neighbours than two a cycle.

The number of cycles may be fractional: all but the last pass through every node, and the last
only through the nodes whose hash for it is in its share of the range (the first ones of its
order), so that a count that follows the number of members changes smoothly with it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

__all__ = ["expander_cycles", "expander_neighbours", "union_of_cycles"]

NodeId = str

#: Every member derives its graph on every change of its view, from the same hashes: they are
#: kept, per (seed, cycle), up to this many ids each.
_RANK_CACHE_LIMIT = 1 << 16
_RANK_CACHE: dict[tuple[int, int], dict[NodeId, int]] = {}


def expander_cycles(n: int) -> float:
    """The expander's cycles among ``n`` members: log2 n - 1, at least 1. The exponential
    graph has ⌈log2 n⌉ offsets, each two edges at a node but the offset n/2 (one), so the two
    have about the same degree."""
    return max(1.0, math.log2(n) - 1) if n > 0 else 1.0


def union_of_cycles(
    order: Iterable[NodeId], cycles: float, seed: int, paused: frozenset[NodeId] = frozenset()
) -> dict[NodeId, frozenset[NodeId]]:
    """Each node's neighbours in the union of ``cycles`` cycles through ``order``.

    ``paused`` nodes keep their places in the cycles but have no edges; the first cycle alone
    closes the gaps they leave (it is made over the others), so the graph stays connected and
    a pause moves only the edges at the paused node and one across its gap.
    """
    nodes = tuple(order)
    active = tuple(i for i in nodes if i not in paused)
    adj: dict[NodeId, set[NodeId]] = {i: set() for i in active}
    for c in range(math.ceil(cycles)):
        cycle = [i for _, i in sorted(_in_cycle(seed, c, cycles, active if c == 0 else nodes))]
        for a, b in zip(cycle, cycle[1:] + cycle[:1], strict=True):
            if a != b and a not in paused and b not in paused:  # a cycle of one has no edge
                adj[a].add(b)
                adj[b].add(a)
    return {i: frozenset(js) for i, js in adj.items()}


def expander_neighbours(
    ids: Iterable[NodeId], node: NodeId, seed: int = 0, paused: Iterable[NodeId] = ()
) -> frozenset[NodeId]:
    """``node``'s neighbours on the expander over ``ids`` (gossip/topology.py ``expander``),
    without the whole graph: in each cycle they are the ids of the next hash above and below
    its own, which one pass over the ids finds (a member asks on every change to its view)."""
    nodes, held = frozenset(ids), frozenset(paused)
    if node not in nodes or node in held:
        raise KeyError(node)
    cycles = expander_cycles(len(nodes))
    found: set[NodeId] = set()
    for c in range(math.ceil(cycles)):
        ranked = _in_cycle(seed, c, cycles, nodes - held if c == 0 else nodes)
        mine = next((x for x in ranked if x[1] == node), None)
        if mine is None:  # not in the last cycle's share
            continue
        after = [x for x in ranked if x > mine]
        before = [x for x in ranked if x < mine]
        if after or before:
            found.add((min(after) if after else min(before))[1])
            found.add((max(before) if before else max(after))[1])
    return frozenset(found - held)


def _in_cycle(
    seed: int, cycle: int, cycles: float, nodes: Iterable[NodeId]
) -> list[tuple[int, NodeId]]:
    """(hash, id) of the ``nodes`` in ``cycle`` of ``cycles``: all of them, but in the last,
    fractional one those whose hash is in its share of the range."""
    known = _RANK_CACHE.setdefault((seed, cycle), {})
    if len(known) > _RANK_CACHE_LIMIT:  # ids seen over a long life: start afresh
        known.clear()
    ranked = []
    for i in nodes:
        rank = known.get(i)
        if rank is None:
            digest = hashlib.blake2b(f"{seed}\0{cycle}\0{i}".encode(), digest_size=8).digest()
            rank = known[i] = int.from_bytes(digest, "big")
        ranked.append((rank, i))
    share = cycles - cycle
    if share < 1:
        below = int(share * (1 << 64))
        ranked = [x for x in ranked if x[0] < below]
    return ranked
