"""What a :class:`gossip.mixing.Mixer` is configured by (:class:`MixConfig`) and what each of
its rounds reports (:class:`Round`), kept apart from the mixer's decisions so the daemon, the
simulator and their tests can name them without the rounds' machinery."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gossip.codecs import Encoded
from gossip.robust import ATTACKS
from gossip.schedules import ScheduleConfig
from gossip.trigger import TriggerConfig

__all__ = ["MixConfig", "NodeId", "Round"]

NodeId = str


@dataclass(frozen=True)
class MixConfig:
    """Args:
    gamma: consensus step size γ.
    silence_limit_s: a neighbour silent longer than this leaves the mix until it speaks.
    robust: mix by ClippedGossip (gossip/robust.py) and leave out neighbours whose anomaly
        score is over its threshold (doubles the replicas' memory: see ``NeighbourScores``).
    byzantine_fraction: δ of the clipping radius, with ``robust``.
    attack: testing only: publish a harmful target (gossip/robust.py's ``ATTACKS``) instead of
        the model, through valid deltas, and do not mix.
    trigger: make a round only when it is worth its bytes (gossip/trigger.py); None: every
        round asked for is made.
    link_gamma: with codecs that change (``auto``: one per link, or with one public copy one
        per round), γ by codec: a link's pair term is mixed
        with the smaller γ of its two directions' codecs (this node's on the link, and the
        codec of the neighbour's last delta; the smallest γ before that delta), which both
        ends compute alike, so the pair's terms still cancel in the mean; ``gamma`` then
        scales them all. None: one γ for every link.
    schedule: with a copy per link, a time-varying schedule over the links
        (gossip/schedules.py :class:`LinkSchedule`): each round goes to the links it picks
        among the ready ones, mixed at its weight; None: every ready link, Metropolis weights.
    """

    gamma: float = 1.0  # exact averaging for fp32; harsher codecs need less (DEFAULT_GAMMA)
    silence_limit_s: float = 30.0  # ~3 SWIM suspicion timeouts: a dead one is gone by then
    robust: bool = False
    byzantine_fraction: float = 0.25  # one bad neighbour in four, ClippedGossip's experiments
    attack: str | None = None
    trigger: TriggerConfig | None = None
    link_gamma: Mapping[str, float] | None = None
    schedule: ScheduleConfig | None = None

    def __post_init__(self) -> None:
        if not 0 < self.gamma <= 1 or self.silence_limit_s <= 0:
            raise ValueError("need 0 < gamma <= 1 and a positive silence limit")
        if self.link_gamma is not None and not all(0 < g <= 1 for g in self.link_gamma.values()):
            raise ValueError(f"every link γ must be in (0, 1], got {dict(self.link_gamma)}")
        if not 0 <= self.byzantine_fraction < 1:
            raise ValueError("byzantine_fraction must be in [0, 1)")
        if self.attack is not None and self.attack not in ATTACKS:
            raise ValueError(f"unknown attack {self.attack!r}; known: {', '.join(ATTACKS)}")


@dataclass(frozen=True)
class Round:
    """What one round made and decided.

    ``weights`` are the neighbours it mixed with (empty: it did not mix). The changes of the
    mixer's decisions come with the figures a log line wants: the neighbours that left the mix
    for their silence (seconds silent), that spoke again, that were evicted or readmitted by
    their anomaly score (the score).
    """

    seq: int
    payload: Encoded
    weights: Mapping[NodeId, float]
    silenced: frozenset[NodeId]
    evicted: frozenset[NodeId]
    went_silent: Mapping[NodeId, float]
    spoke_again: frozenset[NodeId]
    newly_evicted: Mapping[NodeId, float]
    readmitted: Mapping[NodeId, float]
    reason: str = "always"  # why it was made (gossip/trigger.py's REASONS)
    #: With a copy per link (GossipState ``per_link``): each link's seq and delta; ``seq`` and
    #: ``payload`` are then the first link's (by id).
    links: Mapping[NodeId, tuple[int, Encoded]] = field(default_factory=dict)
