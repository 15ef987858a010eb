"""Plain CHOCO-Gossip (Koloskova et al. 2019): which neighbours take part in a mix and with what
weight, the mix itself, and one plain round of it. gossip/mixing.py's :class:`Mixer` makes a
node's rounds out of these.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping

import torch

from gossip.codecs import Encoded
from gossip.outer import OuterNesterov
from gossip.replicas import GossipState

__all__ = ["convex_steps", "mix", "mix_and_send", "mixing_weights"]

NodeId = str


def mixing_weights(
    state: GossipState, neighbours: Iterable[NodeId], degree: int, silence_limit_s: float
) -> dict[NodeId, float]:
    """Neighbours that take part in this round, with Metropolis–Hastings weights.

    A neighbour takes part once it has sent us its public copy (so it counts us as its
    neighbour too) and while it is heard from: one silent for longer than ``silence_limit_s``
    leaves the mix (its weight stays with x_i) until it speaks again, and so does one whose
    copy was taken back from the parked ones until its stream confirms it
    (:meth:`GossipState.set_peers`). Its weight
    1 / (1 + max(d_i, d_j)) uses the degree it last told us, so both ends of the edge weigh it
    the same even while their member views differ, and each row still sums to at most one.

    Args:
        degree: this node's number of neighbours, d_i.
    """
    mix = {}
    for peer in neighbours:
        replica = state.replicas.get(peer)
        silent = state.silent_for(peer)
        if (
            replica is not None
            and not replica.unconfirmed
            and silent is not None
            and silent <= silence_limit_s
        ):
            mix[peer] = 1.0 / (1 + max(degree, replica.degree))
    return mix


def mix(
    state: GossipState,
    x: torch.Tensor,
    gamma: float,
    weights: Mapping[NodeId, float],
    outer: OuterNesterov | None = None,
    toward: Mapping[NodeId, float] | None = None,
) -> None:
    """The outer step on the local steps' change if there is one, then x += γ Σ_j w_ij (x̂_j -
    x̂_i), and with ``toward`` also γ Σ_k w_ik (x̂_k - x), from x as the step found it (a
    schedule's pull toward copies that arrived on links its round did not go to); in
    place."""
    if outer is not None:
        outer.step(x)
    toward = toward or {}
    base = x.clone() if toward else x
    state.consensus_step(x, gamma, weights)
    for peer in sorted(toward):  # in the ids' order, as consensus_step sums
        x.add_(state.replicas[peer].value.to(x.dtype) - base, alpha=gamma * toward[peer])
    if outer is not None:
        outer.rebase(x)


def convex_steps(
    gamma: float, steps: Mapping[NodeId, float], toward: Mapping[NodeId, float]
) -> tuple[Mapping[NodeId, float], Mapping[NodeId, float]]:
    """A schedule's pulls scaled so that γ Σ w stays at most one: a round that mixes more
    copies than its own links (an epidemic node drawn by several senders at once) stays a
    convex step, as Epidemic Learning's average of what it received is."""
    total = gamma * (sum(steps.values()) + sum(toward.values()))
    if total <= 1.0:
        return steps, toward
    return (
        {p: w / total for p, w in steps.items()},
        {p: w / total for p, w in toward.items()},
    )


def mix_and_send(
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
    asynchronous): mix with the neighbours' replicas, then q = Q(x - x̂), x̂ += q.

    The mix comes first: it uses x̂_i as the neighbours hold it, as a rule (the pacing holds a
    round back while a link carries deltas; the daemon's window lets one still be in flight),
    so the two ends of a link pull by opposite amounts and the mean moves only by training.
    Mixing against x̂_i after this round's q, which the neighbours do not have yet, would take
    back γ Σ_j w_ij of every local step: the mean would move at 1 / (1 + γ Σ_j w_ij) of the
    training's pace.

    Args:
        lock: held while ``x`` is read and while it is written, not while compressing (the
            daemon's trainer steps on another thread in between).
        on_weights: told the round's weights (the daemon logs who left the mix for silence).

    Returns:
        The round's sequence number and q, which goes to every neighbour.
    """
    guard = lock if lock is not None else contextlib.nullcontext()
    neighbours = frozenset(neighbours)
    weights = mixing_weights(state, neighbours, len(neighbours), silence_limit_s)
    if on_weights is not None:
        on_weights(weights)
    with guard:
        mix(state, x, gamma, weights, outer)
        current = x.clone()
    seq, payload = state.make_delta(current)
    return seq, payload
