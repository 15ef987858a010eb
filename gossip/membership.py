"""The node's view of the swarm: the live members of its SWIM state, and its neighbours."""

from __future__ import annotations

from collections.abc import Mapping

from gossip.messages import Member
from gossip.swim import Swim
from gossip.topology import Graph, reachable_graph
from gossip.view_graph import live_graph, neighbours_of

__all__ = ["MemberView", "relink"]

NodeId = str


class MemberView:
    """Live (alive or suspect) members of ``swim``, itself included, keyed by node id.

    Suspects stay in the view: a suspicion is often refuted, and re-deriving the topology for
    every one would make the links churn. Dead and departed members leave it. Paused members
    stay in it too, but out of the topology: the graph is over the members that gossip.
    """

    def __init__(self, swim: Swim) -> None:
        self.swim = swim

    @property
    def me(self) -> Member:
        return Member(self.swim.node_id, self.swim.address)

    def __len__(self) -> int:
        return len(self.swim.live_members())

    def __contains__(self, node_id: object) -> bool:
        return self.get(str(node_id)) is not None

    def get(self, node_id: str) -> Member | None:
        record = self.swim.record(node_id)
        return Member(record.node_id, record.address) if record and record.live else None

    @property
    def members(self) -> tuple[Member, ...]:
        return tuple(Member(r.node_id, r.address) for r in self.swim.live_members())

    def graph(self, kind: str, *, degree: int = 4, seed: int = 0) -> Graph:
        """The graph ``kind`` over the live members, the paused out of it, as this view has it."""
        records = self.swim.live_members()
        regions = {r.node_id: r.region for r in records}
        paused = (r.node_id for r in records if r.paused)
        graph = live_graph(kind, regions, paused, degree=degree, seed=seed, regions=regions)
        return reachable_graph(graph, frozenset(r.node_id for r in records if not r.reachable))

    @property
    def unreachable(self) -> frozenset[NodeId]:
        """Live members that nobody can dial (their records name relays)."""
        return frozenset(r.node_id for r in self.swim.live_members() if not r.reachable)

    @property
    def regions(self) -> dict[NodeId, str]:
        """Each live member's region ("" where it names none)."""
        return {r.node_id: r.region for r in self.swim.live_members()}

    @property
    def paused(self) -> frozenset[NodeId]:
        """Live members that are paused: members still, out of the topology."""
        return frozenset(r.node_id for r in self.swim.live_members() if r.paused)

    def ring(self) -> tuple[NodeId, ...]:
        """The ids the graph is over (the live members that gossip), in ring order."""
        if self.swim.paused:
            return ()
        return tuple(sorted(r.node_id for r in self.swim.live_members() if not r.paused))

    def neighbours(self, kind: str, *, degree: int = 4, seed: int = 0) -> dict[NodeId, Member]:
        """This member's neighbours in the graph ``kind`` over the live members, by id.

        Every member derives the graph from its own view (which says who is reachable), so two
        members with the same view agree on every edge; the link handshake (a snapshot refused
        by a member that does not count the sender as its neighbour yet) covers the time their
        views differ.
        """
        # One snapshot of the view. A paused member is in no one's graph, its own included:
        # its neighbours' weights renormalise over the others, and it has none. On the ring
        # and the exponential graph it keeps its place, so that its pause moves only the
        # edges at it (gossip/view_graph.py ``paused_out``).
        if self.swim.paused:
            return {}
        records = self.swim.live_members()
        by_id = {r.node_id: r for r in records}
        paused = frozenset(r.node_id for r in records if r.paused)
        regions = {r.node_id: r.region for r in records} if kind == "regional" else None
        me = self.swim.node_id
        unreachable = frozenset(r.node_id for r in records if not r.reachable) - paused
        if unreachable:
            graph = live_graph(kind, by_id, paused, degree=degree, seed=seed, regions=regions)
            # Only edges with one end others can dial: the other end opens the connection.
            mine = reachable_graph(graph, unreachable).neighbours(me)
        else:
            mine = neighbours_of(kind, by_id, me, paused, degree=degree, seed=seed, regions=regions)
        return {j: Member(j, by_id[j].address) for j in sorted(mine)}


def relink(
    linked: Mapping[NodeId, Member], wanted: Mapping[NodeId, Member]
) -> tuple[list[NodeId], list[NodeId]]:
    """Which links to close and which to open to go from ``linked`` to ``wanted``.

    A neighbour that moved (same id, another address) gets a new link: the old one dials
    where nobody is.

    Returns:
        (ids whose link closes, ids that get a new link), each sorted.
    """
    close = sorted(j for j, m in linked.items() if wanted.get(j) != m)
    keep = linked.keys() - set(close)
    return close, sorted(wanted.keys() - keep)
