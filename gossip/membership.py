"""A node's view of the swarm's members (static for now: members are added, never removed)."""

from __future__ import annotations

from collections.abc import Iterable

from gossip.messages import Member
from gossip.topology import Graph, build

__all__ = ["MemberView"]


class MemberView:
    """The members this node knows, itself included, keyed by node id."""

    def __init__(self, me: Member) -> None:
        self.me = me
        self._members: dict[str, Member] = {me.node_id: me}

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._members

    def get(self, node_id: str) -> Member | None:
        return self._members.get(node_id)

    @property
    def members(self) -> tuple[Member, ...]:
        return tuple(self._members[i] for i in sorted(self._members))

    def merge(self, members: Iterable[Member]) -> list[Member]:
        """Adds members not known yet (or known at another address); returns those that changed."""
        changed = []
        for m in members:
            if m.node_id == self.me.node_id:
                continue
            if self._members.get(m.node_id) != m:
                self._members[m.node_id] = m
                changed.append(m)
        return changed

    def graph(self, kind: str, *, degree: int = 4, seed: int = 0) -> Graph:
        return build(kind, self._members, degree=degree, seed=seed)
