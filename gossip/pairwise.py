"""CHOCO gossip with a public copy per link: each link its own codec, its own period, its own pace.

gossip/replicas.py keeps one public copy x̂_i per node, and every neighbour replicates it: one
delta serves all links, but every link must carry every delta, so the slowest link sets the pace
of all, and all links share one codec. Here node i keeps a copy x̂_ij per link instead, which
only j replicates, and mixes over the pairs:

* sending on link (i, j): q = Q_ij(x_i − x̂_ij); x̂_ij += q; q goes to j alone. What a link did
  not send stays in x_i − x̂_ij, for that link's next message (error feedback per link), so a
  link that sends every tenth round sends the change of ten rounds in one message, not ten;
* receiving q from j: x̂_ji += q (j's copy for this link, bit-identical to j's);
* mixing: x_i += γ Σ_j w_ij (x̂_ji − x̂_ij).

Each pair's two terms cancel in the sum over nodes (w symmetric), so the mean is kept, as in
CHOCO; as every copy tracks its owner's model the step is the usual consensus step. The price is
memory: two vectors per link (the copy and the replica) instead of one, plus one per node.

A link mixes only once it holds both copies (a new link starts from a snapshot each way, as a
new CHOCO neighbour does), and a link that did not exchange this round is left out of its mix
(:class:`PairwiseSwarm`): its copies are stale, and applying the same stale difference round
after round would overshoot.

Pure and synchronous, as the rest of the core; :class:`PairwiseSwarm` runs it in lock-step over
a graph whose edges have codecs and periods (gossip/topology.py ``regional`` builds one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from gossip.codecs import Codec, Encoded
from gossip.simulate import consensus_distance
from gossip.topology import Graph

__all__ = ["PairLink", "PairwiseGossip", "PairwiseSwarm"]

NodeId = str


@dataclass
class PairLink:
    """One link's two copies, as node i holds them."""

    codec: Codec
    public: torch.Tensor  # x̂_ij: what j believes x_i is
    seq: int = 0
    replica: torch.Tensor | None = None  # x̂_ji, bit-identical to j's copy at ``replica_seq``
    replica_seq: int = -1


class PairwiseGossip:
    """Node i's half of CHOCO gossip with a copy per link.

    Args:
        x: x_i at the start (flat float32); each new link's copy starts equal to the model.
        generator: randomness for stochastic rounding.
    """

    def __init__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> None:
        if x.dim() != 1 or x.dtype != torch.float32:
            raise ValueError("the gossiped vector must be flat float32")
        self.numel = x.numel()
        self.generator = generator
        self.links: dict[NodeId, PairLink] = {}

    def open(self, peer: NodeId, codec: Codec, x: torch.Tensor) -> tuple[int, torch.Tensor]:
        """Start the link to ``peer``: x̂_ij = x_i. Returns the snapshot (seq 0, a copy) that
        ``peer`` must take with :meth:`receive_snapshot` before deltas follow."""
        self.links[peer] = PairLink(codec, x.detach().clone())
        return 0, x.detach().clone()

    def set_codec(self, peer: NodeId, codec: Codec) -> None:
        """Send on the link with ``codec`` from the next delta on. Both copies stay as they
        are: each delta carries its codec's encoding, decoded by its own rules, so replicas stay
        bit-identical across the change."""
        self.links[peer].codec = codec

    def make_delta(self, peer: NodeId, x: torch.Tensor) -> tuple[int, Encoded]:
        """q = Q_ij(x − x̂_ij); x̂_ij += q. Returns the link's new seq and q's encoding."""
        link = self.links[peer]
        compressed = link.codec.compress(x - link.public, self.generator)
        link.public += compressed.value
        link.seq += 1
        return link.seq, compressed.encoded

    def receive_snapshot(self, peer: NodeId, seq: int, values: torch.Tensor) -> None:
        link = self.links[peer]
        if values.numel() != self.numel or not bool(torch.isfinite(values).all()):
            raise ValueError(f"a snapshot from {peer} of the wrong size or not finite")
        link.replica = values.detach().clone()
        link.replica_seq = seq

    def receive_delta(self, peer: NodeId, seq: int, payload: Encoded, codec: Codec) -> None:
        """x̂_ji += q, decoded by ``codec`` (the sender's for this delta)."""
        link = self.links[peer]
        if link.replica is None or seq != link.replica_seq + 1:
            raise ValueError(f"delta {seq} from {peer} does not follow {link.replica_seq}")
        codec.validate(payload)
        value = codec.decode(payload, link.public.device)
        value += link.replica
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"the delta from {peer} would overflow its replica")
        link.replica = value
        link.replica_seq = seq

    def pull(self, weights: Mapping[NodeId, float]) -> torch.Tensor | None:
        """Σ_j w_ij (x̂_ji − x̂_ij) over the links in ``weights`` that hold both copies, in the
        order of the peers' ids; None when none does."""
        total: torch.Tensor | None = None
        for peer in sorted(weights):
            link = self.links.get(peer)
            if link is None or link.replica is None or weights[peer] == 0.0:
                continue
            term = (link.replica - link.public).mul_(weights[peer])
            total = term if total is None else total.add_(term)
        return total

    def consensus_step(
        self, x: torch.Tensor, gamma: float, weights: Mapping[NodeId, float]
    ) -> torch.Tensor:
        """x += γ Σ_j w_ij (x̂_ji − x̂_ij), in place."""
        pull = self.pull(weights)
        if pull is not None:
            x.add_(pull, alpha=gamma)
        return x


Edge = tuple[NodeId, NodeId]  # sorted


class PairwiseSwarm:
    """n nodes doing per-link CHOCO gossip in lock-step over ``graph``.

    Edge (i, j) exchanges at round r when r is a multiple of its ``period``, with its codec, and
    only then takes part in the two nodes' mixes, with Metropolis–Hastings weights on the round's
    graph (the links that exchanged): a node whose slow links are quiet this round gives its
    other links their weight.

    Args:
        codec_of: each edge's codec (by its sorted pair).
        period_of: each edge's period in rounds (1: every round).
        gamma: consensus step size.
        gamma_of: each edge's own step size instead (a sign link needs a smaller one).
        seed: seeds each node's stochastic rounding.
    """

    def __init__(
        self,
        graph: Graph,
        initial: Mapping[NodeId, torch.Tensor],
        codec_of: Callable[[Edge], Codec],
        gamma: float,
        period_of: Callable[[Edge], int] = lambda _: 1,
        seed: int = 0,
        gamma_of: Callable[[Edge], float] | None = None,
    ) -> None:
        self.graph = graph
        self.gamma = gamma
        self.x = {i: initial[i].detach().clone() for i in graph.nodes}
        self.edges: list[Edge] = sorted(
            {(min(i, j), max(i, j)) for i in graph.nodes for j in graph.adj[i]}
        )
        self.codec = {e: codec_of(e) for e in self.edges}
        self.period = {e: period_of(e) for e in self.edges}
        # a link's own step γ_ij, as a factor on γ (symmetric, so the mean is kept)
        self.scale = {e: 1.0 if gamma_of is None else gamma_of(e) / gamma for e in self.edges}
        self.nodes: dict[NodeId, PairwiseGossip] = {}
        for k, i in enumerate(graph.nodes):
            gen = torch.Generator().manual_seed(seed * 100_003 + k)
            self.nodes[i] = PairwiseGossip(self.x[i], gen)
        for a, b in self.edges:  # every link starts from an exact snapshot each way
            for i, j in ((a, b), (b, a)):
                self.nodes[i].open(j, self.codec[(a, b)], self.x[i])
            for i, j in ((a, b), (b, a)):
                self.nodes[j].receive_snapshot(i, 0, self.nodes[i].links[j].public)
        self.rounds = 0
        self.bytes_sent = 0
        self.bytes_by_edge: dict[Edge, int] = dict.fromkeys(self.edges, 0)

    def active(self, edge: Edge) -> bool:
        return self.rounds % self.period[edge] == 0

    def round(self) -> None:
        """Active links exchange a delta each way, then every node mixes over its active
        links."""
        live = [e for e in self.edges if self.active(e)]
        for a, b in live:
            codec = self.codec[(a, b)]
            for i, j in ((a, b), (b, a)):
                seq, payload = self.nodes[i].make_delta(j, self.x[i])
                self.nodes[j].receive_delta(i, seq, payload, codec)
                self.bytes_sent += payload.nbytes
                self.bytes_by_edge[(a, b)] += payload.nbytes
        on = set(live)
        degree = dict.fromkeys(self.graph.nodes, 0)  # in this round's graph
        for a, b in live:
            degree[a] += 1
            degree[b] += 1
        for i in self.graph.nodes:
            weights = {}
            for j in self.graph.adj[i]:
                edge = (min(i, j), max(i, j))
                if edge in on:  # Metropolis–Hastings on the links that exchanged this round
                    weights[j] = self.scale[edge] / (1 + max(degree[i], degree[j]))
            self.nodes[i].consensus_step(self.x[i], self.gamma, weights)
        self.rounds += 1

    def consensus_distance(self) -> float:
        return consensus_distance(self.x)

    def mean(self) -> torch.Tensor:
        return torch.stack([x.to(torch.float64) for x in self.x.values()]).mean(dim=0)
