"""The node's view of the swarm: the live members of its SWIM state, and its neighbours."""

from __future__ import annotations

from gossip.messages import Member
from gossip.swim import Swim
from gossip.topology import Graph, build

__all__ = ["MemberView"]


class MemberView:
    """Live (alive or suspect) members of ``swim``, itself included, keyed by node id.

    Suspects stay in the view: a suspicion is often refuted, and re-deriving the topology for
    every one would make the links churn. Dead and departed members leave it.
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
        return build(kind, [m.node_id for m in self.members], degree=degree, seed=seed)
