"""Gossip among many in-memory nodes on a synchronous schedule (no training, no network).

This is the reference schedule of CHOCO-Gossip: in each round every node sends its delta to its
neighbours, every replica is updated, then every node mixes. Messages travel as encoded bytes, the
same path the daemon takes, so what converges here converges for the same reasons there.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from gossip.clock import ManualClock
from gossip.codecs import Codec
from gossip.replicas import GossipState
from gossip.topology import Graph, metropolis_hastings

__all__ = ["SyncSwarm", "consensus_distance"]

NodeId = str


def consensus_distance(models: Mapping[NodeId, torch.Tensor]) -> float:
    """Mean squared distance of the models from their average: (1/n) Σ_i ||x_i - x̄||²."""
    stacked = torch.stack([m.to(torch.float64) for m in models.values()])  # (n, numel)
    return float(((stacked - stacked.mean(dim=0)) ** 2).sum(dim=1).mean())


class SyncSwarm:
    """n nodes doing compressed gossip in lock-step over ``graph``.

    Args:
        graph: who talks to whom.
        initial: each node's starting vector (float32, all the same length).
        codec: the compression operator every node uses.
        gamma: consensus step size.
        seed: seeds each node's stochastic rounding.
    """

    def __init__(
        self,
        graph: Graph,
        initial: Mapping[NodeId, torch.Tensor],
        codec: Codec,
        gamma: float,
        seed: int = 0,
    ) -> None:
        self.graph = graph
        self.gamma = gamma
        self.clock = ManualClock()
        self.weights = metropolis_hastings(graph)
        self.x = {i: initial[i].detach().clone() for i in graph.nodes}
        self.states: dict[NodeId, GossipState] = {}
        for k, i in enumerate(graph.nodes):
            gen = torch.Generator(device=self.x[i].device).manual_seed(seed * 100_003 + k)
            self.states[i] = GossipState(self.x[i], codec, self.clock, gen, session=k)
            for j in graph.neighbours(i):
                self.states[i].admit(j)
        # Every replica starts from the neighbour's exact public copy, as after a join.
        for i in graph.nodes:
            seq, values = self.states[i].snapshot()
            for j in graph.neighbours(i):
                self.states[j].receive_snapshot(i, self.states[i].session, seq, values)
        self.bytes_sent = 0
        self.rounds = 0

    def round(self) -> None:
        """One synchronous round: everyone sends, everyone receives, everyone mixes."""
        for i in self.graph.nodes:
            seq, payload = self.states[i].make_delta(self.x[i])
            for j in self.graph.neighbours(i):
                self.states[j].receive_delta(i, self.states[i].session, seq, payload)
                self.bytes_sent += payload.nbytes
        for i in self.graph.nodes:
            self.states[i].consensus_step(self.x[i], self.gamma, self.weights[i])
        self.clock.advance(1.0)
        self.rounds += 1

    def consensus_distance(self) -> float:
        return consensus_distance(self.x)

    def mean(self) -> torch.Tensor:
        return torch.stack([x.to(torch.float64) for x in self.x.values()]).mean(dim=0)
