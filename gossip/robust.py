"""Byzantine-robust mixing: ClippedGossip with an adaptive radius, and a per-neighbour anomaly
score.

ClippedGossip (He, Karimireddy and Jaggi, "Byzantine-robust decentralized learning via
ClippedGossip", 2022, arXiv:2202.01545) replaces the gossip average by

    x_i += γ Σ_j w_ij CLIP(d_j, τ_i),    CLIP(d, τ) = d · min(1, τ / ||d||),

so that a Byzantine neighbour, whatever it sends, moves x_i by at most γ w_ij τ_i in a round,
while honest neighbours within τ_i of node i are averaged with as before.

**Which pull is clipped.** The paper clips z_j - x_i, with z_j what neighbour j sent and x_i the
node's own model. Under CHOCO-Gossip (gossip/replicas.py) the mixing term is x̂_j - x̂_i, both
public copies; x_i - x̂_i is node i's own compression residual, which error feedback sends later.
We clip d_j = x̂_j - x̂_i: with nothing clipped (τ ≥ every ||d_j||) the step is exactly
:meth:`GossipState.consensus_step`, so robust mixing changes nothing among honest nodes that are
close, and the residual — which is i's own, not a neighbour's, and cannot be Byzantine — is
neither clipped nor pulled back.

**The radius.** The paper's analysis sets τ_i² = (1/δ_i) Σ_{j honest} w_ij E||x_i - x_j||², with
δ_i the weight of i's Byzantine neighbours; the honest set is unknown to node i, so its
experiments use an adaptive rule that clips the neighbours farthest from i. We implement that
rule as a weighted quantile (:func:`clip_radius`): sort the neighbours by ||d_j||; τ_i is the
largest distance whose cumulative weight, nearest first, is at most 1 - δ of the neighbours'
total weight. So at least the farthest δ of the weight is clipped, and τ_i is a distance of an
honest neighbour whenever the Byzantine ones carry at most δ of the weight and are the farthest.
With a single neighbour there is nothing to compare it with and nothing is clipped.

**The anomaly score** (:class:`AnomalyScore`) is our own heuristic, not from the paper: for each
neighbour, an exponential moving average of how far its replica is beyond the clipping radius and
of how far the norm of its latest deltas is above the others' median (or this node's own change,
if larger). A neighbour whose score is over the threshold leaves the mix until the score decays
under it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from gossip.replicas import GossipState

__all__ = [
    "ATTACKS",
    "AnomalyScore",
    "ClipResult",
    "NeighbourScores",
    "attack_target",
    "clip_radius",
    "clipped_consensus_step",
]

NodeId = str

#: What a Byzantine node may publish instead of its model, to test robustness (never in a real
#: swarm): ``scale`` 10·x, ``flip`` -x, ``random`` x plus unit Gaussian noise, ``huge`` x plus
#: a random direction of norm 1e4·||x||, ``spike`` x with 0.1% of its coordinates set to
#: ±1e3·max|x|.
ATTACKS = ("scale", "flip", "random", "huge", "spike")

#: The most neighbours' anomaly scores a node remembers, linked now or before (a few floats
#: each).
REMEMBERED = 4096

HUGE_FACTOR = 1e4  # far beyond any honest delta, yet finite in float32 for any sane model
SPIKE_SHARE = 1e-3  # a sparse attack: few coordinates, so a norm over all of them hides little
SPIKE_FACTOR = 1e3  # ... each far outside the model's range


def clip_radius(
    distances: Mapping[NodeId, float], weights: Mapping[NodeId, float], byzantine_fraction: float
) -> float:
    """τ: the largest distance whose cumulative weight (nearest first) is at most 1 - δ.

    Args:
        distances: ||d_j|| per neighbour.
        weights: w_ij per neighbour (those in ``distances``).
        byzantine_fraction: δ in [0, 1), the share of the weight assumed Byzantine.

    Returns:
        τ; the nearest neighbour's distance when it alone carries more than 1 - δ; infinity
        without neighbours.
    """
    if not 0 <= byzantine_fraction < 1:
        raise ValueError(f"byzantine_fraction must be in [0, 1), got {byzantine_fraction}")
    ranked = sorted((distances[p], weights[p]) for p in distances if weights[p] > 0)
    if not ranked:
        return math.inf
    total = sum(w for _, w in ranked)
    keep = (1 - byzantine_fraction) * total * (1 + 1e-9)  # rounding must not drop a neighbour
    tau, cumulative = ranked[0][0], 0.0
    for distance, w in ranked:
        cumulative += w
        if cumulative > keep:
            break
        tau = distance
    return tau


@dataclass(frozen=True)
class ClipResult:
    tau: float
    #: Neighbours whose pull was shortened to τ.
    clipped: frozenset[NodeId]


def clipped_consensus_step(
    state: GossipState,
    x: torch.Tensor,
    gamma: float,
    weights: Mapping[NodeId, float],
    byzantine_fraction: float,
    excluded: frozenset[NodeId] = frozenset(),
) -> ClipResult:
    """x += γ Σ_j w_ij CLIP(x̂_j - x̂_i, τ_i), in place, τ_i from :func:`clip_radius`.

    Neighbours without a replica, or with weight 0, are left out (their weight stays with x_i),
    as in :meth:`GossipState.consensus_step`. ``excluded`` neighbours (evicted ones) still count
    in τ_i but do not pull: leaving a neighbour out must not widen the radius, or evicting honest
    neighbours by mistake would leave a Byzantine one unclipped.
    """
    pulls: dict[NodeId, torch.Tensor] = {}
    for peer in sorted(weights):  # summed in the order of ids, as consensus_step does
        w = weights[peer]
        replica = state.replicas.get(peer)
        if replica is not None and w != 0.0:
            pulls[peer] = replica.value - state.public
    if not pulls:
        return ClipResult(math.inf, frozenset())
    norms = {p: float(d.norm()) for p, d in pulls.items()}
    tau = clip_radius(norms, weights, byzantine_fraction)
    total = torch.zeros_like(state.public)
    clipped = set()
    for peer, d in pulls.items():
        if peer in excluded:
            continue
        scale = 1.0
        if norms[peer] > tau:
            scale = tau / norms[peer]
            clipped.add(peer)
        total.add_(d, alpha=weights[peer] * scale)
    x.add_(total.to(x.dtype), alpha=gamma)
    return ClipResult(tau, frozenset(clipped))


class AnomalyScore:
    """Per-neighbour suspicion from how far its replica is beyond the clipping radius and how
    large its deltas are.

    Each :meth:`update` takes every neighbour's change since the last update, Δ_j, and, when
    given, its distance ||x̂_j - x̂_i|| and the clipping radius τ_i. The update's raw score is

        min(cap, max(0, ||x̂_j - x̂_i|| / τ_i - distance_slack))
        + min(cap, max(0, |Δ_j| / max(median_{k≠j} |Δ_k|, ||Δ_i||, usual_j) - norm_slack))

    with |Δ_j| the norm per local step Δ_j covers (below), and the score moves to
    ``(1 - w) · score + w · raw``. Both references resist the attackers: τ_i is a distance of
    an honest neighbour while the Byzantine weight is at most δ (:func:`clip_radius`), and node
    i's own change Δ_i, when given, is the least reference norm: neighbours can raise it, never
    lower it. A sign-flipping neighbour publishes -x, two norms of the model away while honest
    replicas are a consensus distance apart, so the distance finds it although its deltas look
    honest.
    There is no direction term: an earlier one (against the others' mean direction) evicted
    honest neighbours, whose deltas near consensus are mostly pulls toward each other and so
    point against each other, and with two flippers among five neighbours the mean was theirs.
    A neighbour whose Δ is zero (nothing heard since the last update) keeps its score, raised
    only by its distance term.

    **Honest nodes out of step.** Real nodes do not train in step: one device is five times
    faster than its neighbours, one starts a second after them, or trains on after they have
    finished, and its deltas are then many times theirs and its replica some radii away. Three
    things keep that from evicting it:

    - Norms are per local step: each ||Δ_j|| is divided by the steps it covers, as j told them
      with its deltas (``steps``). A sender that claims more steps than it made only weakens
      the norm term against itself; the distance term does not depend on what it says.
    - ``usual_j``, a moving average of j's own delta norms, fed only with the deltas that were
      within ``norm_slack`` of the others' reference. A neighbour that trains on after the
      others have stopped is judged against the deltas it sent while they all trained; one
      that jumps is judged against its deltas before the jump; and an attacker can raise its
      own reference to at most ``norm_slack`` times the others', never beyond.
    - Given the time of each update, ``w`` is 1 − e^(−dt/time_constant_s), dt the time since
      the neighbour's last update (at most ``1 - decay``): the score is a moving average over
      seconds, not over rounds, so a few hundred milliseconds out of step do not evict, while
      an attacker is out within two seconds (0.4-1.9 s with real processes, bench/RESULTS.md).
      Without times, ``w = 1 - decay`` for each update, as for rounds in lock-step.

    Args:
        decay: the moving average's memory per update without times, in [0, 1); with times,
            1 - decay is the most one update weighs.
        threshold: a score over it evicts the neighbour.
        norm_slack: how many times the reference norm a delta may be without penalty.
        distance_slack: how many times τ_i a replica may be away without penalty.
        cap: the most one update's term adds; with the defaults one update moves the score
            by at most (1 - decay) · 2 · cap = 1, so a single odd update cannot evict alone
            (deltas between rounds are uneven under asynchronous gossip).
        time_constant_s: the moving average's time constant when updates come with times.
    """

    def __init__(
        self,
        decay: float = 0.9,
        threshold: float = 1.0,
        norm_slack: float = 4.0,
        distance_slack: float = 4.0,
        cap: float = 5.0,
        time_constant_s: float = 3.0,
    ) -> None:
        if not 0 <= decay < 1:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        if time_constant_s <= 0:
            raise ValueError(f"time_constant_s must be positive, got {time_constant_s}")
        self.decay, self.threshold, self.norm_slack, self.cap = decay, threshold, norm_slack, cap
        self.distance_slack, self.time_constant_s = distance_slack, time_constant_s
        self.scores: dict[NodeId, float] = {}
        self.usual: dict[NodeId, float] = {}  # each neighbour's ordinary delta norm
        self._last: dict[NodeId, float] = {}  # when each neighbour's score last moved

    def update(
        self,
        deltas: Mapping[NodeId, torch.Tensor],
        distances: Mapping[NodeId, float] | None = None,
        radius: float = math.inf,
        own: torch.Tensor | None = None,
        now: float | None = None,
        steps: Mapping[NodeId, int] | None = None,
    ) -> dict[NodeId, float]:
        """Score this update's deltas; returns the scores of the neighbours that were updated.

        Args:
            deltas: Δ_j per neighbour.
            distances: ||x̂_j - x̂_i|| per neighbour (None: no distance term).
            radius: τ_i, the clipping radius the distances are judged against.
            own: Δ_i, this node's own change, a reference no neighbour can forge.
            now: the time of this update, in seconds (None: updates are rounds in lock-step).
            steps: the local steps each Δ_j covers, as its sender told them (none given: one);
                its norm is taken per step.
        """
        live = {p: d.to(torch.float64) for p, d in deltas.items() if bool(d.any())}
        told = steps or {}
        norms = {p: float(d.norm()) / max(1, told.get(p, 1)) for p, d in live.items()}
        own_norm = [float(own.norm())] if own is not None and bool(own.any()) else []
        updated = {}
        for peer in {*deltas, *(distances or {})}:
            far = 0.0
            if distances is not None and peer in distances and 0 < radius < math.inf:
                far = min(self.cap, max(0.0, distances[peer] / radius - self.distance_slack))
            old = self.scores.get(peer, 0.0)
            if peer not in live:
                if far > 0:
                    w = self._weight(peer, now)
                    self.scores[peer] = updated[peer] = max(old, (1 - w) * old + w * far)
                continue
            others = [norms[q] for q in live if q != peer]
            if not others and not own_norm and far == 0:
                continue
            w = self._weight(peer, now)
            raw = far
            if others or own_norm:
                # Neighbours can only raise the reference above this node's own change, never
                # lower it (a stopped attacker's deltas are zero: a median with it was tiny).
                median = float(torch.tensor(others).median()) if others else 0.0
                reference = max([median, *own_norm])
                usual = self.usual.get(peer, 0.0)
                if reference > 0 and norms[peer] <= self.norm_slack * reference:
                    self.usual[peer] = (1 - w) * usual + w * norms[peer]
                reference = max(reference, usual)
                ratio = norms[peer] / reference if reference > 0 else self.cap
                raw += min(self.cap, max(0.0, ratio - self.norm_slack))
            score = (1 - w) * old + w * raw
            self.scores[peer] = updated[peer] = score
        return updated

    def _weight(self, peer: NodeId, now: float | None) -> float:
        """What this update of ``peer`` weighs: ``1 - decay``, or with times the share of the
        time constant since its last update (none at the first, which only starts its clock)."""
        most = 1 - self.decay
        if now is None:
            return most
        last = self._last.get(peer)
        self._last[peer] = now
        if last is None:
            return 0.0
        return min(most, -math.expm1(-max(0.0, now - last) / self.time_constant_s))

    def evicted(self) -> frozenset[NodeId]:
        return frozenset(p for p, s in self.scores.items() if s > self.threshold)

    def forget(self, peer: NodeId) -> None:
        self.scores.pop(peer, None)
        self.usual.pop(peer, None)
        self._last.pop(peer, None)


class NeighbourScores:
    """The anomaly score of each neighbour, fed with the change of its replica between two of
    this node's rounds (its deltas since, whatever their number), its distance from this
    node's public copy, the clipping radius of those distances, and this node's own change. A
    replica restarted by a new session is not a change. Keeps a copy of each neighbour's
    replica from the last round, so it doubles the replicas' memory.

    The radius the distances are judged against is τ_i (uniform weights), but at least
    ``radius_floor`` of ||x̂_i||: near consensus honest replicas agree to the codec's precision,
    so τ_i shrinks to nothing and a neighbour a thousandth of the model's norm away would count
    as twenty radii out, while a replica that close can move the model by a negligible amount.

    Args:
        score: the score to feed (a default :class:`AnomalyScore` if None).
        byzantine_fraction: δ of the radius the distances are judged against.
        radius_floor: the least radius, as a share of ||x̂_i||.
    """

    def __init__(
        self,
        score: AnomalyScore | None = None,
        byzantine_fraction: float = 0.25,  # the daemon's default δ
        radius_floor: float = 0.01,  # a flipper is 2 norms away, 50 times the floor's slack
    ) -> None:
        self.anomaly = score or AnomalyScore()
        self.byzantine_fraction, self.radius_floor = byzantine_fraction, radius_floor
        self._seen: dict[NodeId, tuple[int, torch.Tensor, int]] = {}  # (session, replica, step)
        self._own: torch.Tensor | None = None

    def update(self, state: GossipState, neighbours: frozenset[NodeId]) -> frozenset[NodeId]:
        """Score the neighbours' changes since the last update; returns those evicted now."""
        deltas, distances, steps = {}, {}, {}
        for peer in neighbours:
            replica = state.replicas.get(peer)
            if replica is None:
                continue
            distances[peer] = float((replica.value - state.public).norm())
            seen = self._seen.get(peer)
            if seen is not None and seen[0] == replica.session:
                deltas[peer] = replica.value - seen[1]
                steps[peer] = replica.step - seen[2]
            self._seen[peer] = (replica.session, replica.value.clone(), replica.step)
        own = None if self._own is None else state.public - self._own
        self._own = state.public.clone()
        # Uniform weights: the score judges positions, whatever weight the mix gives them.
        radius = clip_radius(distances, dict.fromkeys(distances, 1.0), self.byzantine_fraction)
        radius = max(radius, self.radius_floor * float(state.public.norm()))
        self.anomaly.update(deltas, distances, radius, own, now=state.clock.now(), steps=steps)
        return self.anomaly.evicted() & neighbours

    def forget(self, peers: frozenset[NodeId]) -> None:
        """Drop the copies kept of ``peers``' replicas (links closed), not their scores: a
        neighbour evicted for its score is still out when the graph links it again, as it does
        when members come and go (an attacker on a fresh score pulled at an honest node with
        two neighbours for a second, at the end of an e2e run). At most ``REMEMBERED`` scores
        are kept, the longest known dropped first."""
        for peer in peers:
            self._seen.pop(peer, None)
        scores = self.anomaly.scores
        while len(scores) > REMEMBERED:
            self.anomaly.forget(next(iter(scores)))


def attack_target(attack: str, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """What a node mounting ``attack`` (one of :data:`ATTACKS`) publishes instead of ``x``,
    through valid deltas, so that its neighbours' replicas accept every message."""
    if attack == "scale":
        return x * 10
    if attack == "flip":
        return -x
    if attack == "random":
        return x + torch.randn(x.shape, generator=generator, device=x.device)
    if attack == "huge":
        direction = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        size = HUGE_FACTOR * (float(x.norm()) or 1.0)  # a zero model is still attacked
        return x + direction * (size / float(direction.norm()))
    if attack == "spike":
        count = min(x.numel(), max(1, round(SPIKE_SHARE * x.numel())))
        where = torch.randperm(x.numel(), generator=generator, device=x.device)[:count]
        signs = torch.randint(0, 2, (count,), generator=generator, device=x.device) * 2 - 1
        size = SPIKE_FACTOR * (float(x.abs().max()) or 1.0) if count else 0.0
        spiked = x.clone().reshape(-1)
        spiked[where] = signs.to(x.dtype) * size
        return spiked.reshape(x.shape)
    raise ValueError(f"unknown attack {attack!r}; known: {', '.join(ATTACKS)}")
