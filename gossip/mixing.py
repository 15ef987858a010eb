"""The decisions of a gossip round that the daemon and the simulator share.

Which neighbours take part in a round's mix and with what weight, the round itself (send, then
mix), and when a node makes a round at all. The daemon (``node/gossiper.py``, ``node/node.py``)
runs these on its threads and event loop; the simulator (``node/sim``) on simulated time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch

from gossip.codecs import Encoded
from gossip.outer import OuterNesterov
from gossip.replicas import GossipState

__all__ = ["RoundPacer", "mix", "mixing_weights", "send_and_mix"]

NodeId = str


def mixing_weights(
    state: GossipState, neighbours: Iterable[NodeId], degree: int, silence_limit_s: float
) -> dict[NodeId, float]:
    """Neighbours that take part in this round, with Metropolis–Hastings weights.

    A neighbour takes part once it has sent us its public copy (so it counts us as its
    neighbour too) and while it is heard from: one silent for longer than ``silence_limit_s``
    leaves the mix (its weight stays with x_i) until it speaks again. Its weight
    1 / (1 + max(d_i, d_j)) uses the degree it last told us, so both ends of the edge weigh it
    the same even while their member views differ, and each row still sums to at most one.

    Args:
        degree: this node's number of neighbours, d_i.
    """
    mix = {}
    for peer in neighbours:
        replica = state.replicas.get(peer)
        silent = state.silent_for(peer)
        if replica is not None and silent is not None and silent <= silence_limit_s:
            mix[peer] = 1.0 / (1 + max(degree, replica.degree))
    return mix


def mix(
    state: GossipState,
    x: torch.Tensor,
    gamma: float,
    weights: Mapping[NodeId, float],
    outer: OuterNesterov | None = None,
) -> None:
    """x += γ Σ_j w_ij (x̂_j - x̂_i), then the outer step if there is one; in place."""
    state.consensus_step(x, gamma, weights)
    if outer is not None:
        outer.step(x)


def send_and_mix(
    state: GossipState,
    x: torch.Tensor,
    gamma: float,
    neighbours: Iterable[NodeId],
    silence_limit_s: float,
    outer: OuterNesterov | None = None,
    lock: contextlib.AbstractContextManager[object] | None = None,
    on_weights: Callable[[Mapping[NodeId, float]], None] | None = None,
) -> tuple[int, Encoded]:
    """One plain round of CHOCO-Gossip (Koloskova et al. 2019, Algorithm 1, made
    asynchronous): q = Q(x - x̂), x̂ += q, then mix with the neighbours' replicas.

    Args:
        lock: held while ``x`` is read and while it is written, not while compressing (the
            daemon's trainer steps on another thread in between).
        on_weights: told the round's weights (the daemon logs who left the mix for silence).

    Returns:
        The round's sequence number and q, which goes to every neighbour.
    """
    guard = lock if lock is not None else contextlib.nullcontext()
    neighbours = frozenset(neighbours)
    with guard:
        current = x.clone()
    seq, payload = state.make_delta(current)
    weights = mixing_weights(state, neighbours, len(neighbours), silence_limit_s)
    if on_weights is not None:
        on_weights(weights)
    with guard:
        mix(state, x, gamma, weights, outer)
    return seq, payload


@dataclass
class RoundPacer:
    """When a node makes a gossip round: at least ``local_steps`` training steps after the last
    one, never while one is being made, and only while no healthy link is busy.

    Rounds are paced by the network: skipping one loses nothing (x - x̂ keeps what was not
    sent), whereas queueing rounds that the network cannot carry would only make every
    neighbour's replica staler. Not thread-safe: the daemon holds a lock around it.
    """

    local_steps: int
    last_round_step: int = 0
    making: bool = False
    links_idle: bool = True

    def due(self, step: int) -> bool:
        """Whether enough steps passed since the last round for another."""
        return step - self.last_round_step >= self.local_steps

    def begin(self, step: int) -> bool:
        """Start a round at ``step`` unless one is being made or a link is busy."""
        if self.making or not self.links_idle:
            return False
        self.making = True
        self.last_round_step = step
        return True

    def end(self) -> None:
        self.making = False
