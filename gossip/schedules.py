"""Time-varying peer schedules: whom a node sends to at round r, from the round and the view alone.

Both are directed: the sender picks its peers and the receiver takes whatever arrives, so they
pair with push-sum (gossip/pushsum.py), which keeps the mean when nobody sends back.

* **one-peer exponential** (Ying, Yuan, Chen, Hu, Pan and Yin, NeurIPS 2021): with the view on a
  ring in sorted order and τ = ⌈log2 n⌉, node i sends at round r to i + 2^(r mod τ) and, in the
  synchronous schedule, hears from i − 2^(r mod τ); each keeps half of its mass and sends half.
  Every round's mixing matrix is a circulant with two halves, so doubly stochastic, and for n a
  power of two the product of any τ consecutive rounds is exactly 11ᵀ/n: exact averaging in
  log2 n rounds with one message per node per round. For other n it is not exact, and the error
  falls by the second largest singular value of the τ-round product per τ rounds
  (:func:`one_peer_contraction` computes it; tests/gossip/test_schedules.py checks the rate).
* **epidemic** (Vos, Farhadkhani, Guerraoui, Kermarrec, Pires and Sharma, 2023, "EL-Oracle"):
  node i sends at round r to ``fanout`` peers drawn uniformly from the view, from a hash of a
  swarm-wide seed, i and r, so a draw is reproducible anywhere and differs between nodes and
  rounds.

Any two members that hold the same view agree on every node's peers at every round without a
word: there is no coordinator, and a receiver can check that a sender's round names it.

:class:`LinkSchedule` runs both over the links of a node with a copy per link (CHOCO, made
pairwise: gossip/pairwise.py, the daemon's ``--pace link``), which is how ``murmur run
--topology one-peer-exponential`` and ``--topology epidemic`` gossip. A delta-coded link needs a
replica at both ends and is mixed on both ends, so there the schedules are undirected: at its
round r a node sends to its links of offset class k = r mod τ on both sides of the ring
(i ± 2^k: two deltas a round, one each way round the ring, and its peer i + 2^k sends it the other
direction at its own class-k round), or to ``fanout`` of its links drawn afresh each round.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

__all__ = [
    "SCHEDULES",
    "LinkPlan",
    "LinkSchedule",
    "ScheduleConfig",
    "epidemic_peers",
    "one_peer_contraction",
    "one_peer_matrix",
    "one_peer_offset",
    "one_peer_peer",
    "peers_at",
    "ring_classes",
]

NodeId = str

SCHEDULES = ("one-peer-exponential", "epidemic")


def _order(view: Iterable[NodeId]) -> tuple[NodeId, ...]:
    order = tuple(sorted(set(view)))
    if not order:
        raise ValueError("a schedule needs at least one node")
    return order


def _period(n: int) -> int:
    """τ = ⌈log2 n⌉ (1 for n ≤ 2)."""
    return max(1, (n - 1).bit_length())


def one_peer_offset(n: int, round_: int) -> int:
    """2^(round mod τ): how far along the ring a node's peer is at ``round_``."""
    if n < 1 or round_ < 0:
        raise ValueError(f"need n ≥ 1 and round ≥ 0, got n={n}, round={round_}")
    return 1 << (round_ % _period(n))


def one_peer_peer(view: Iterable[NodeId], node: NodeId, round_: int) -> NodeId | None:
    """The peer ``node`` sends to at ``round_`` (None when it is alone)."""
    order = _order(view)
    n = len(order)
    if n < 2:
        return None
    pos = order.index(node)
    return order[(pos + one_peer_offset(n, round_)) % n]


def epidemic_peers(
    view: Iterable[NodeId], node: NodeId, round_: int, fanout: int, seed: int = 0
) -> tuple[NodeId, ...]:
    """The ``fanout`` peers (fewer when the view is smaller) ``node`` sends to at ``round_``,
    sorted: a uniform draw without replacement from the others in the view."""
    if fanout < 1:
        raise ValueError(f"fanout is {fanout}: expected at least 1")
    order = _order(view)
    others = [j for j in order if j != node]
    key = hashlib.blake2b(f"{seed}\0{node}\0{round_}".encode(), digest_size=8).digest()
    rng = random.Random(int.from_bytes(key, "big"))
    return tuple(sorted(rng.sample(others, min(fanout, len(others)))))


def peers_at(
    kind: str, view: Iterable[NodeId], node: NodeId, round_: int, *, fanout: int = 1, seed: int = 0
) -> tuple[NodeId, ...]:
    """The peers of ``node`` at ``round_`` under the schedule ``kind`` (one of
    :data:`SCHEDULES`)."""
    if kind == "one-peer-exponential":
        peer = one_peer_peer(view, node, round_)
        return () if peer is None else (peer,)
    if kind == "epidemic":
        return epidemic_peers(view, node, round_, fanout, seed)
    raise ValueError(f"unknown schedule {kind!r}; known: {', '.join(SCHEDULES)}")


def one_peer_matrix(n: int, round_: int) -> torch.Tensor:
    """W_r of the synchronous one-peer exponential schedule (float64): x_i ← ½ x_i + ½ x_(i−2^k),
    so row i takes half from itself and half from the node that sends to it."""
    w = torch.zeros(n, n, dtype=torch.float64)
    off = one_peer_offset(n, round_) % n
    for i in range(n):
        w[i, i] += 0.5
        w[i, (i - off) % n] += 0.5
    return w


def one_peer_contraction(n: int) -> float:
    """The factor by which one period (τ rounds) of the schedule shrinks the distance from the
    mean at worst: the largest singular value of W_(τ−1)…W_0 off the all-ones direction (0 for n
    a power of two)."""
    product = torch.eye(n, dtype=torch.float64)
    for r in range(_period(n)):
        product = one_peer_matrix(n, r) @ product
    centred = product - torch.full((n, n), 1.0 / n, dtype=torch.float64)
    return float(torch.linalg.matrix_norm(centred, ord=2))


def ring_classes(ring: Sequence[NodeId], node: NodeId) -> dict[NodeId, int]:
    """Each peer of ``node`` at offset ±2^k on ``ring`` (the view's ids in sorted order), by the
    least such k: the link classes of the one-peer exponential schedule over the exponential
    graph's links (gossip/topology.py ``exponential``, whose edges are exactly these)."""
    order = _order(ring)
    n = len(order)
    if node not in order or n < 2:
        return {}
    pos = order.index(node)
    classes: dict[NodeId, int] = {}
    for k in range(_period(n)):
        for offset in (1 << k, -(1 << k)):
            classes.setdefault(order[(pos + offset) % n], k)
    classes.pop(node, None)
    return classes


@dataclass(frozen=True)
class ScheduleConfig:
    """A time-varying schedule over a node's links (``--topology one-peer-exponential`` or
    ``epidemic``).

    Args:
        kind: one of :data:`SCHEDULES`.
        fanout: with ``epidemic``, the links a round goes to (Epidemic Learning's s).
        seed: seeds the epidemic draws (the same on every node, as the graph's seed).
    """

    kind: str
    fanout: int = 2  # EL's s; 2 agreed in 17-18 rounds at 64-1,024 nodes (bench/RESULTS.md)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.kind!r}; known: {', '.join(SCHEDULES)}")
        if self.fanout < 1:
            raise ValueError(f"fanout is {self.fanout}: expected at least 1")

    @property
    def weight(self) -> float:
        """The mixing weight of each link a round goes to: 1/(1 + the links of a round), the
        same at both ends of a link whatever either end's view (one-peer: the two sides of
        the ring; epidemic: ``fanout``), so a pair's terms still cancel in the mean."""
        return 1.0 / (1 + (2 if self.kind == "one-peer-exponential" else self.fanout))


@dataclass(frozen=True)
class LinkPlan:
    """What a node's topology says of its links beyond which they are, from the view they came
    from (node/daemon/neighbourhood.py derives it).

    Args:
        classes: the one-peer exponential schedule's offset class of each link
            (:func:`ring_classes`).
        periods: a link here carries a delta in at most one round of every P of the node's
            (a bridge between regions, ``--bridge-period``); the others, every round.
        codecs: a link here sends with a codec of its own (a bridge, ``--bridge-compress``).
    """

    classes: Mapping[NodeId, int] = field(default_factory=dict)
    periods: Mapping[NodeId, int] = field(default_factory=dict)
    codecs: Mapping[NodeId, str] = field(default_factory=dict)


@dataclass
class LinkSchedule:
    """Which of a node's ready links its next link round goes to: a link with a period (a
    bridge, :class:`LinkPlan`) only once that many rounds passed since its last delta, then,
    with a time-varying schedule, the links it picks among those. The round counter is the
    node's own (rounds are asynchronous, so nothing needs the ends' counters to agree: a link
    that is not due keeps its unsent change for the round that is).

    A class whose links are all busy or down is passed over for the next that has a ready
    link, so a dead or slow neighbour never stalls the cycle; the epidemic draw is among the
    ready links. Not thread-safe, like the Mixer that owns it.
    """

    #: The time-varying schedule (None: every ready link that is due).
    cfg: ScheduleConfig | None = None
    #: Link rounds made.
    rounds: int = 0
    #: One-peer exponential: the class the next round starts looking at.
    cursor: int = 0
    #: One-peer exponential: each link's offset class (:func:`ring_classes`).
    classes: Mapping[NodeId, int] = field(default_factory=dict)
    #: Links that carry a delta only every so many rounds, and the round of each link's last.
    periods: Mapping[NodeId, int] = field(default_factory=dict)
    last_sent: dict[NodeId, int] = field(default_factory=dict)

    def set_classes(self, classes: Mapping[NodeId, int]) -> None:
        self.classes = dict(classes)

    def set_plan(self, plan: LinkPlan, links: frozenset[NodeId]) -> None:
        """Follow ``plan`` for exactly ``links`` (what it says of others is dropped)."""
        self.set_classes({p: k for p, k in plan.classes.items() if p in links})
        self.periods = {p: k for p, k in plan.periods.items() if p in links and k > 1}
        self.last_sent = {p: r for p, r in self.last_sent.items() if p in links}

    def due(self, ready: frozenset[NodeId]) -> frozenset[NodeId]:
        """The links of ``ready`` whose period has passed since their last delta."""
        return frozenset(
            p
            for p in ready
            if p not in self.periods
            or p not in self.last_sent
            or self.rounds + 1 - self.last_sent[p] >= self.periods[p]
        )

    def pick(self, ready: frozenset[NodeId]) -> frozenset[NodeId]:
        """The links of ``ready`` the next round goes to (empty when none fits)."""
        if not ready or self.cfg is None:
            return ready
        if self.cfg.kind == "epidemic":
            order = sorted(ready)
            key = hashlib.blake2b(
                f"{self.cfg.seed}\0{self.rounds}\0{chr(0).join(order)}".encode(), digest_size=8
            ).digest()
            rng = random.Random(int.from_bytes(key, "big"))
            return frozenset(rng.sample(order, min(self.cfg.fanout, len(order))))
        period = max(self.classes.values(), default=0) + 1
        # A link the view has no class for yet (the views differ for a moment) keeps a class
        # of its own, from its id, so it is still served once a cycle.
        of = {p: self.classes.get(p, _hashed_class(p, period)) for p in ready}
        for d in range(period):
            k = (self.cursor + d) % period
            chosen = frozenset(p for p, c in of.items() if c == k)
            if chosen:
                return chosen
        return frozenset()  # unreachable: every ready link has a class below period

    def made(self, chosen: frozenset[NodeId], sent: Iterable[NodeId] | None = None) -> None:
        """A round went to ``chosen`` (what :meth:`pick` gave) and its deltas to ``sent``
        (by default ``chosen``): on to the next."""
        self.rounds += 1
        for peer in chosen if sent is None else sent:
            self.last_sent[peer] = self.rounds
        if self.cfg is not None and self.cfg.kind == "one-peer-exponential" and chosen:
            period = max(self.classes.values(), default=0) + 1
            k = min(self.classes.get(p, _hashed_class(p, period)) for p in chosen)
            self.cursor += (k - self.cursor) % period + 1


def _hashed_class(peer: NodeId, period: int) -> int:
    digest = hashlib.blake2b(peer.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") % period
