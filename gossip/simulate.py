"""Gossip among many in-memory nodes on a synchronous schedule (no training, no network).

:class:`SyncSwarm` is the reference schedule of CHOCO-Gossip: in each round every node sends its
delta to its neighbours, every replica is updated, then every node mixes. Messages travel as
encoded bytes, the same path the daemon takes, so what converges here converges for the same
reasons there. :class:`PushSumSwarm` runs push-sum over a time-varying schedule
(gossip/schedules.py) the same way, with messages lost at random.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Protocol

import torch

from gossip.clock import ManualClock
from gossip.codecs import Codec
from gossip.pushsum import PushGap, PushSum
from gossip.replicas import GossipState
from gossip.schedules import peers_at
from gossip.topology import Graph, metropolis_hastings

__all__ = ["PushSumSwarm", "SyncSwarm", "consensus_distance", "rounds_to_consensus"]

NodeId = str


def consensus_distance(models: Mapping[NodeId, torch.Tensor]) -> float:
    """Mean squared distance of the models from their average: (1/n) Σ_i ||x_i - x̄||²."""
    stacked = torch.stack([m.to(torch.float64) for m in models.values()])  # (n, numel)
    return float(((stacked - stacked.mean(dim=0)) ** 2).sum(dim=1).mean())


class Rounds(Protocol):
    """A lock-step swarm: :class:`SyncSwarm`, :class:`PushSumSwarm`, gossip/pairwise.py's."""

    def round(self) -> None: ...

    def consensus_distance(self) -> float: ...


def rounds_to_consensus(swarm: Rounds, factor: float, max_rounds: int) -> int | None:
    """Rounds until the swarm's consensus distance fell ``factor``-fold; None if it had not
    after ``max_rounds``."""
    target = swarm.consensus_distance() / factor
    for r in range(1, max_rounds + 1):
        swarm.round()
        if swarm.consensus_distance() <= target:
            return r
    return None


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


class PushSumSwarm:
    """n nodes doing push-sum in lock-step, each sending at round r to its peers under the
    schedule ``kind`` (gossip/schedules.py); each message (and each resync) is lost with
    probability ``loss``. A sender learns of a loss as a gRPC caller does (no answer), and sends
    the link's running sums at the start of the next round, which may be lost too; a receiver
    that sees a gap first refuses it and is sent them at once.

    Args:
        initial: each node's starting vector (all the same length and dtype).
        kind: ``one-peer-exponential`` or ``epidemic``.
        fanout: peers per round for ``epidemic``.
        loss: the chance that a message does not arrive.
        seed: the epidemic draw's and the losses' seed.
    """

    def __init__(
        self,
        initial: Mapping[NodeId, torch.Tensor],
        kind: str,
        *,
        fanout: int = 1,
        loss: float = 0.0,
        seed: int = 0,
    ) -> None:
        if not 0.0 <= loss < 1.0:
            raise ValueError(f"loss is {loss}: expected 0 <= loss < 1")
        self.kind, self.fanout, self.loss, self.seed = kind, fanout, loss, seed
        self.view = tuple(sorted(initial))
        self.nodes = {i: PushSum(i, initial[i]) for i in self.view}
        self._rng = random.Random(seed)
        self.rounds = 0
        self.messages = 0
        self.bytes_sent = 0
        self.resyncs = 0
        self._owed: set[tuple[NodeId, NodeId]] = set()  # links whose last send was lost

    def _arrives(self) -> bool:
        return self.loss == 0.0 or self._rng.random() >= self.loss

    def _resync(self, sender: NodeId, to: NodeId) -> None:
        resync = self.nodes[sender].resync(to)
        self.resyncs += 1
        self.bytes_sent += resync.nbytes
        if self._arrives():
            self.nodes[to].receive_resync(resync)
            self._owed.discard((sender, to))
        else:
            self._owed.add((sender, to))

    def round(self) -> None:
        """Links owed their running sums get them; then every node sends under the schedule at
        this round, and what arrives is taken."""
        for sender, to in sorted(self._owed):
            self._resync(sender, to)
        outgoing = []
        for i in self.view:
            peers = peers_at(
                self.kind, self.view, i, self.rounds, fanout=self.fanout, seed=self.seed
            )
            outgoing.extend(self.nodes[i].send(peers))
        for message in outgoing:
            self.messages += 1
            self.bytes_sent += message.nbytes
            if not self._arrives():
                self._owed.add((message.sender, message.to))
                continue
            try:
                self.nodes[message.to].receive(message)
            except PushGap:
                self._resync(message.sender, message.to)
        self.rounds += 1

    def flush(self) -> None:
        """Every link's running sums delivered, losslessly: what a resync after the last round
        brings (nothing is in flight afterwards)."""
        for i in self.view:
            for peer in sorted(self.nodes[i].out_links):
                self.nodes[peer].receive_resync(self.nodes[i].resync(peer))
        self._owed.clear()

    def estimates(self) -> dict[NodeId, torch.Tensor]:
        return {i: s.estimate() for i, s in self.nodes.items()}

    def consensus_distance(self) -> float:
        """(1/n) Σ_i ||z_i − z̄||² over the estimates."""
        return consensus_distance(self.estimates())

    def total(self) -> tuple[torch.Tensor, float]:
        """Σ_i x_i (float64) and Σ_i w_i: the mass the nodes hold."""
        value = torch.stack([s.value.to(torch.float64) for s in self.nodes.values()]).sum(0)
        return value, sum(s.weight for s in self.nodes.values())
