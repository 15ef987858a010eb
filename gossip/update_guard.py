"""What a neighbour's update must pass before it changes a replica, and why one is refused.

The replica state machine (gossip/replicas.py) refuses a message by raising a
:class:`GossipError`: a sender it does not exchange with (:class:`UnknownPeer`), a delta that
does not follow the replica (:class:`SequenceGap`), a duplicate or replay
(:class:`StaleSequence`), or an update the :class:`UpdateGuard` finds implausible
(:class:`ImplausibleUpdate`). gossip/refusals.py maps each to the reason a refusal carries.

Besides its shape and finite values, a delta or snapshot may not put the replica absurdly far
from this node's own public copy, since mixing would carry the node's model most of the way
there. The same measure of distance, :func:`relative_distance`, lets a joiner adopt a pulled
model only once a second member's agrees with it (:func:`agreeing_pair`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "GossipError",
    "ImplausibleUpdate",
    "SequenceGap",
    "StaleSequence",
    "UnknownPeer",
    "UpdateGuard",
    "agreeing_pair",
    "relative_distance",
]

NodeId = str


class GossipError(Exception):
    """A message the state machine refuses; the state is unchanged when it is raised."""


class UnknownPeer(GossipError):
    """The sender is not a peer this node exchanges with."""


class SequenceGap(GossipError):
    """The delta does not follow the replica (or there is no replica): a snapshot is needed."""

    def __init__(self, peer: NodeId, expected: int | None, got: int) -> None:
        self.peer, self.expected, self.got = peer, expected, got
        want = "a snapshot first" if expected is None else f"seq {expected}"
        super().__init__(f"gap in deltas from {peer}: expected {want}, got seq {got}")


class StaleSequence(GossipError):
    """The message is not newer than the replica: a duplicate or a replay."""


class ImplausibleUpdate(GossipError):
    """A delta or snapshot that would put a replica absurdly far from this node's public copy
    (or, with ``UpdateGuard.consistency``, a snapshot that agrees with no other neighbour)."""


@dataclass(frozen=True)
class UpdateGuard:
    """What a neighbour's delta or snapshot may do to its replica x̂_j, judged against this
    node's public copy x̂_i (which tracks its model x_i).

    The rule: ``||x̂_j' - x̂_i|| <= max_distance * max(||x̂_i||, floor_rms * sqrt(n))`` for the
    replica x̂_j' that the update would make. Why it holds for honest traffic: CHOCO keeps each
    x̂_j within a few rounds' movement of x_j, and x_j within the consensus distance of x_i, so
    honest neighbours are a small fraction of the model's norm apart (the largest ratio in
    measured runs of every codec is in bench/RESULTS.md); even a fresh node still at the initial
    model is within a few norms of a trained one. Why it matters: mixing moves x_i by
    γ·w_ij·(x̂_j − x̂_i), so a replica 32 norms away would move the model several times its own
    size in one round, and a replica of 1e38 (which is finite) would overflow it. The bound is
    relative to this node's own copy, never to the sender's earlier updates, so a sender cannot
    raise it by growing its replica step by step. Robust mixing (ClippedGossip) then limits what
    a neighbour within the bound can do.

    Args:
        max_distance: the bound, in norms of x̂_i.
        floor_rms: the norm used for a model that is (nearly) zero, per value.
        consistency: with robust mixing, a snapshot must also lie within this many norms of
            x̂_i or of another neighbour's replica, when there is one ("consistent with a second
            member"); None: no such check.
    """

    max_distance: float = 32.0
    floor_rms: float = 1e-2
    consistency: float | None = None

    def __post_init__(self) -> None:
        if not self.max_distance > 0 or not self.floor_rms > 0:
            raise ValueError("max_distance and floor_rms must be positive")
        if self.consistency is not None and not self.consistency > 0:
            raise ValueError("consistency must be positive")

    def distance(self, values: torch.Tensor, to: torch.Tensor) -> float:
        """||values - to|| in norms of ``to`` (at least ``floor_rms`` per value)."""
        diff = float(torch.linalg.vector_norm(values.to(to.device) - to))
        floor = self.floor_rms * math.sqrt(max(to.numel(), 1))
        return diff / max(float(torch.linalg.vector_norm(to)), floor)

    def check_plausible(
        self, peer: NodeId, values: torch.Tensor, public: torch.Tensor, what: str
    ) -> float:
        """Refuse the replica ``values`` that the ``what`` ("delta" or "snapshot") from
        ``peer`` would make, if it lies more than ``max_distance`` norms from ``public``.

        Returns:
            Its distance, in norms of ``public``.

        Raises:
            ImplausibleUpdate: it lies too far (or the distance is NaN).
        """
        ratio = self.distance(values, public)
        if not ratio <= self.max_distance:  # also refuses NaN, which compares false
            raise ImplausibleUpdate(
                f"the {what} from {peer} would put its replica {ratio:.3g} times our model's "
                f"norm away from our model (at most {self.max_distance:g})"
            )
        return ratio

    def check_consistent(
        self, peer: NodeId, values: torch.Tensor, public: torch.Tensor, others: list[torch.Tensor]
    ) -> None:
        """With ``consistency``: a snapshot from ``peer`` must agree with this node's copy
        ``public`` or with one of ``others`` (the other neighbours' replicas), when there is
        another to agree with.

        Raises:
            ImplausibleUpdate: it agrees with none.
        """
        limit = self.consistency
        if limit is None or not others:
            return
        refs = [public, *others]
        if any(self.distance(values, ref) <= limit for ref in refs):
            return
        raise ImplausibleUpdate(
            f"the snapshot from {peer} is more than {limit:g} norms from our model and from "
            f"each of our {len(others)} other neighbours' models"
        )


def relative_distance(a: torch.Tensor, b: torch.Tensor, floor_rms: float = 1e-2) -> float:
    """||a - b|| over the larger of the two norms (at least ``floor_rms`` per value)."""
    floor = floor_rms * math.sqrt(max(a.numel(), 1))
    scale = max(float(torch.linalg.vector_norm(a)), float(torch.linalg.vector_norm(b)), floor)
    return float(torch.linalg.vector_norm(a - b)) / scale


def agreeing_pair(
    models: list[torch.Tensor], tolerance: float = 0.5, floor_rms: float = 1e-2
) -> tuple[int, int] | None:
    """The first two of ``models`` (by the later one's place, then the earlier's) that agree:
    within ``tolerance`` of the larger norm of the two. None when no two do.

    A joiner adopts a pulled model only once a second member's agrees with it: honest members
    hold models a consensus distance apart, a few percent of their norm, while a poisoned one
    (1e38 everywhere, a scaled or sign-flipped copy) is at least about its own norm from any
    honest one. One poisoner among the members asked cannot make two models agree.
    """
    for j in range(1, len(models)):
        for i in range(j):
            if relative_distance(models[i], models[j], floor_rms) <= tolerance:
                return i, j
    return None
