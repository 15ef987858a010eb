"""Whom a node gossips with: its neighbours, derived from its member view, one link each.

The one topology update of both runtimes: the daemon (node/daemon/peers.py, over ``PeerLink``) and
the simulator (node/sim/node.py, over ``SimLink``) own a :class:`Neighbourhood` and call
:meth:`Neighbourhood.update` whenever the view changes. It derives the neighbours from the view
(gossip/topology.py's graph over the members' ids), has the gossip state take exactly them
(work that runs where the state lives: node/daemon/steps.py), closes the links to those that went
and, once the node has its starting model, opens links to those that came, greeting each with a
membership ping that carries this node's record (a neighbour that has not heard of us yet counts
us as its neighbour at once instead of a few protocol periods later).

It also says when the node may start training (:meth:`Neighbourhood.ready`): both directions of
every edge are up, so no node trains its first steps alone, which is what the daemon always did;
the simulator follows the same rule.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Generic, Protocol, TypeVar

from gossip.membership import MemberView, relink
from gossip.messages import Member
from gossip.schedules import LinkPlan, ring_classes
from node.config import GossipConfig
from node.daemon.steps import Steps

__all__ = ["Neighbourhood"]


class _Link(Protocol):
    @property
    def peer(self) -> Member: ...

    @property
    def healthy(self) -> bool: ...


L = TypeVar("L", bound=_Link)


class Neighbourhood(Generic[L]):
    """Args:
    view: the node's member view.
    cfg: the topology, its degree and seed (the same on every node).
    open_link: makes (and starts) the link to a new neighbour.
    close_link: lets go of the link to a neighbour that went.
    greet: sends a new neighbour a membership ping with this node's record.
    apply_neighbours: has the gossip state take exactly these neighbours (run where the state
        lives; it drops the replicas of the others), with what the topology says of each link
        (gossip/schedules.py ``LinkPlan``: the one-peer schedule's classes, the bridges'
        periods and codecs).
    """

    def __init__(
        self,
        view: MemberView,
        cfg: GossipConfig,
        open_link: Callable[[Member], L],
        close_link: Callable[[L], None],
        greet: Callable[[Member], None],
        apply_neighbours: Callable[[frozenset[str], LinkPlan], object],
    ) -> None:
        self.view = view
        self.cfg = cfg
        self._open_link = open_link
        self._close_link = close_link
        self._greet = greet
        self._apply_neighbours = apply_neighbours
        self.links: dict[str, L] = {}
        self.neighbours: frozenset[str] = frozenset()
        #: Links open only once the node has its starting model (a joiner pulls one first).
        self.linking = False

    def wanted(self) -> dict[str, Member]:
        """The neighbours the view makes now, by id."""
        cfg = self.cfg
        return self.view.neighbours(cfg.topology, degree=cfg.degree, seed=cfg.seed)

    def update(self) -> Steps[frozenset[str]]:
        """Derive the neighbours from the view; open and close links to match. Returns them."""
        wanted = self.wanted()
        mine = frozenset(wanted)
        plan = self.plan(mine)
        apply = self._apply_neighbours
        yield lambda: apply(mine, plan)
        self.neighbours = mine
        close, open_ = relink({j: link.peer for j, link in self.links.items()}, wanted)
        for peer_id in close:
            self._close_link(self.links.pop(peer_id))
        if self.linking:
            for peer_id in open_:
                peer = wanted[peer_id]
                self.links[peer_id] = self._open_link(peer)
                self._greet(peer)
        return mine

    def plan(self, neighbours: frozenset[str]) -> LinkPlan:
        """What the topology says of each link to ``neighbours``: with one-peer exponential,
        its offset class; for a bridge to another region, its period and codec, if set."""
        cfg, me = self.cfg, self.view.me.node_id
        classes: dict[str, int] = {}
        if cfg.topology == "one-peer-exponential":
            classes = ring_classes(self.view.ring(), me)
        bridges: frozenset[str] = frozenset()
        if cfg.bridge_codec is not None or cfg.bridge_period > 1:
            regions = self.view.regions  # this node's own too, as its record says
            here = regions.get(me, "")
            bridges = frozenset(j for j in neighbours if regions.get(j, "") != here)
        return LinkPlan(
            classes,
            dict.fromkeys(bridges, cfg.bridge_period) if cfg.bridge_period > 1 else {},
            dict.fromkeys(bridges, cfg.bridge_codec) if cfg.bridge_codec is not None else {},
        )

    def start_linking(self) -> Steps[frozenset[str]]:
        """The node has its starting model: link to the neighbours from now on."""
        self.linking = True
        return (yield from self.update())

    def ready(self, members: int, wait_members: int, replicated: Collection[str]) -> bool:
        """Whether the node may start training: ``wait_members`` members are known and every
        edge is up both ways (each neighbour took our public copy, and we hold theirs).

        Args:
            members: members in the view now, this node included.
            replicated: the neighbours whose public copy this node holds.
        """
        return members >= wait_members and not self.down(replicated)

    def down(self, replicated: Collection[str]) -> list[str]:
        """The neighbours whose edge is not up both ways yet (our link to them is not healthy,
        or we do not hold their public copy).

        Args:
            replicated: the neighbours whose public copy this node holds.
        """
        return [
            peer for peer, link in self.links.items() if not link.healthy or peer not in replicated
        ]

    def links_up(self) -> int:
        return sum(link.healthy for link in self.links.values())
