"""The graph one member's view makes: the topology over the live members, with the paused out
of it (gossip/membership.py asks, on every change to the view).

A paused member is in no one's graph. On the ring, the exponential graph and the expander it
keeps its place (:func:`paused_out`, :func:`gossip.topology.expander`), so that a pause or a
resume moves only the edges at it; and a member derives only its own neighbours
(:func:`neighbours_of`), from the ring's order alone where the graph is made of offsets on the
ring, and from each cycle's order on the expander.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping

from gossip.cycles import expander_neighbours
from gossip.schedules import SCHEDULES
from gossip.topology import Graph, NodeId, build, expander, powers_below, resolved, ring_order

__all__ = ["live_graph", "neighbours_of", "paused_out"]

#: The graphs made of offsets on the ring, whose edges at a node follow from the ring alone.
_OFFSET_KINDS = frozenset(("ring", "exponential", *SCHEDULES))
#: The graphs on which a paused member keeps its place (:func:`paused_out`). The schedules
#: keep the offsets on the ring of those not paused, since their link classes are the offsets.
_KEEP_PLACES = frozenset(("ring", "exponential"))


def live_graph(
    kind: str,
    live: Iterable[NodeId],
    paused: Iterable[NodeId] = (),
    *,
    degree: int = 4,
    seed: int = 0,
    regions: Mapping[NodeId, str] | None = None,
) -> Graph:
    """The graph ``kind`` over the ``live`` members, with the ``paused`` ones out of it.

    On the ring, the exponential graph and the expander a paused member keeps its place
    (:func:`paused_out`, :func:`gossip.topology.expander`), so a pause or a resume moves only
    the edges at that member and one across its gap. Every other kind is built over the members
    not paused. ``auto`` is the exponential graph or the expander by the number of live
    members, paused or not, so that a pause never switches between the two.
    """
    held = frozenset(paused)
    live = frozenset(live)
    kind = resolved(kind, len(live))
    if kind in _KEEP_PLACES:
        return paused_out(build(kind, live, degree=degree, seed=seed, regions=regions), held)
    if kind == "expander":
        return expander(live, seed, held) if held else build(kind, live, seed=seed)
    active = [i for i in live if i not in held]
    return build(kind, active, degree=degree, seed=seed, regions=regions)


def paused_out(graph: Graph, paused: frozenset[NodeId]) -> Graph:
    """``graph`` without the ``paused`` members, the gaps they leave on the ring closed.

    Their edges are dropped, and each member not paused also links to the next member not
    paused on either side of the ring, so the graph stays connected (the ring's edges are
    all in it) and a member that pauses or resumes changes only its own edges and the one
    across its gap. Building the graph over the members not paused instead shifts every
    member's place on the ring at each pause, and with it a share of everyone's links: one
    pause in a swarm of 1,024 on the exponential graph moved 1,542 of its 9,728 edges and
    touched every member, each new link opening with a snapshot.
    """
    if not paused:
        return graph
    active = tuple(i for i in graph.nodes if i not in paused)
    adj = {i: {j for j in graph.adj[i] if j not in paused} for i in active}
    if len(active) > 1:
        for pos, i in enumerate(active):
            j = active[(pos + 1) % len(active)]
            adj[i].add(j)
            adj[j].add(i)
    return Graph(active, {i: frozenset(js) for i, js in adj.items()})


def neighbours_of(
    kind: str,
    live: Iterable[NodeId],
    node: NodeId,
    paused: Iterable[NodeId] = (),
    *,
    degree: int = 4,
    seed: int = 0,
    regions: Mapping[NodeId, str] | None = None,
) -> frozenset[NodeId]:
    """``live_graph(kind, live, paused, ...).neighbours(node)``, without the whole graph where
    it is not needed: on the ring, the exponential graph and the schedules over it, a node's
    neighbours are the ids ``2^k`` places before and after it on the ring, found in the ring
    order alone; on the expander, the ids next to it in each cycle's order. Each member asks
    on every change to its view, and a view of a thousand members changes every few
    milliseconds while members pause and come back, so building the graph of all of them each
    time is what a large swarm could not afford (the graph cache cannot help: views that
    differ by one member are different graphs).
    """
    held = frozenset(paused)
    live = frozenset(live)
    kind = resolved(kind, len(live))
    if kind == "expander":
        return expander_neighbours(live, node, seed, held)
    if kind not in _OFFSET_KINDS:
        return live_graph(kind, live, held, degree=degree, seed=seed, regions=regions).neighbours(
            node
        )
    if node in held:
        raise KeyError(node)
    order = ring_order(live if kind in _KEEP_PLACES else (i for i in live if i not in held))
    n = len(order)
    pos = bisect.bisect_left(order, node)
    if pos == n or order[pos] != node:
        raise KeyError(node)
    offsets = [1] if kind == "ring" else powers_below(n)
    found = {order[(pos + sign * off) % n] for off in offsets for sign in (1, -1)}
    if held and kind in _KEEP_PLACES:
        found -= held
        for step in (1, -1):  # the next member not paused on either side closes the gap
            at = (pos + step) % n
            while order[at] in held:  # ends at the latest at ``node``, which is not paused
                at = (at + step) % n
            found.add(order[at])
    found.discard(node)
    return frozenset(found)
