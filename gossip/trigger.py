"""Whether a gossip round is worth its bytes: an event-triggered rule with a heartbeat.

A node that gossips on a timer forever sends a full delta every round long after its model and
its neighbours' have stopped moving. Event-triggered consensus sends only when the state has
drifted far enough from what the neighbours last heard (Dimarogonas, Frazzoli and Johansson,
"Distributed event-triggered control for multi-agent systems", IEEE TAC 2012); SPARQ-SGD (Singh,
Data, George and Diggavi, "SPARQ-SGD: Event-triggered and compressed communication in
decentralized optimization", arXiv:1910.14280) brings the rule to compressed decentralized
SGD with error feedback and keeps its convergence rate: a node sends when ||x - x̂||² exceeds a
threshold tied to the step size, and the unsent change waits in x - x̂, exactly as CHOCO's
compression error does, so skipping a round loses nothing.

The rule here, judged on the gossip worker where the state lives, makes a round when one of:

* **movement**: the unsent change ||x - x̂_i|| exceeds ``threshold`` times μ, an exponentially
  weighted average of how far the node's own work (training steps, a rollback, an adopted
  model) moved x between two rounds. μ is the model's own scale, so the rule needs no units:
  SPARQ's threshold follows the learning rate for the same reason. While the node trains, x - x̂
  holds at least the last steps' movement, about μ, so a round is always worth it; once training
  stops nothing moves x but gossip, μ keeps the scale of the last training rounds, and the
  residual that consensus leaves soon falls below the threshold.
* **news**: a neighbour's replica changed since the last look and the mix would now move x by
  more than the same threshold: γ ||Σ_j w_ij (x̂_j - x̂_i)|| > ``threshold`` · μ. Weighing the
  news, not merely noticing it, is what lets a swarm fall quiet: a heartbeat's tiny delta is news
  too small to answer, so heartbeats do not echo between neighbours.
* **heartbeat**: ``heartbeat_s`` passed since the last round, so that neighbours' replicas are
  never stale for long and their silence detector (``MixConfig.silence_limit_s``) never takes a
  quiet, healthy node for a dead one.

Before the node has moved by itself (μ = 0) there is no scale, and any round with something to
send or to mix is made; so is the node's first round. Time comes from the state's clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from gossip.replicas import GossipState

__all__ = ["REASONS", "RoundTrigger", "TriggerConfig"]

NodeId = str

#: The most one movement counts for, in multiples of μ (μ may still grow by 30% a round).
MAX_RISE = 4.0

#: Why a round was made (``Round.reason``): ``always`` when the rule is off.
REASONS = ("always", "first", "movement", "news", "heartbeat")


@dataclass(frozen=True)
class TriggerConfig:
    """Args:
    threshold: a round is worth it when the unsent change, or the mix's pull, exceeds this
        fraction of the node's recent movement per round.
    heartbeat_s: make a round at least this often, whatever the rule says; at most 0.4 of
        the silence limit is used (:meth:`heartbeat_for`), so two lost heartbeats are no silence.
    smoothing: weight of the newest movement in its running average.
    """

    threshold: float = 0.1  # a tenth of a training round's movement is not worth a full delta
    heartbeat_s: float = 12.0  # 5 rounds a minute: under 1% of idle gossip's 10 rounds/s
    smoothing: float = 0.1  # averages over ~10 rounds: one odd batch does not set the scale

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 1:
            raise ValueError(f"trigger threshold must be in (0, 1), got {self.threshold}")
        if not self.heartbeat_s > 0:
            raise ValueError(f"heartbeat_s must be positive, got {self.heartbeat_s}")
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {self.smoothing}")

    def heartbeat_for(self, silence_limit_s: float) -> float:
        """The heartbeat used under a silence limit: ``heartbeat_s``, at most 0.4 of it."""
        return min(self.heartbeat_s, silence_limit_s * 0.4)


@dataclass
class TriggerStats:
    """Counts of the rule's decisions: rounds made, by reason, and rounds skipped (of which
    ``held``: skipped only because a byte budget was ahead of its allowance)."""

    made: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    skipped: int = 0
    held: int = 0


class RoundTrigger:
    """One node's event-triggered rule (see the module docstring). Not thread-safe: the gossip
    worker calls it, like the state it reads.

    Args:
        heartbeat_s: the heartbeat in seconds (``TriggerConfig.heartbeat_for``).
    """

    def __init__(self, cfg: TriggerConfig, heartbeat_s: float) -> None:
        self.cfg = cfg
        self.heartbeat_s = heartbeat_s
        #: μ: running average of the node's own movement between two rounds (0: none yet).
        self.movement = 0.0
        self.stats = TriggerStats()
        #: Why the last round was made (None before the first).
        self.last_reason: str | None = None
        self._last_made: float | None = None
        self._after: torch.Tensor | None = None  # x as the last round left it
        self._seen: tuple[object, ...] | None = None  # replicas' versions at the last look

    def decide(
        self,
        current: torch.Tensor,
        state: GossipState,
        weights: Mapping[NodeId, float],
        gamma: float,
        hold: bool = False,
    ) -> str | None:
        """Why a round is worth making now, or None when it is not (nothing changes but the
        statistics and μ). ``current`` is a copy of x, ``weights`` the mix's. With ``hold`` (a
        byte budget ahead of its allowance, gossip/budget.py) only the first round and the
        heartbeat are made."""
        self._note_movement(current)
        now = state.clock.now()
        if hold:
            reason = self._due(now)
            if reason is None:
                self.stats.held += 1
        else:
            reason = self._reason(current, state, weights, gamma, now)
        if reason is None:
            self.stats.skipped += 1
        return reason

    def made(self, after: torch.Tensor, now: float, reason: str) -> None:
        """A round was made with ``reason``; ``after`` is a copy of x after its mix."""
        self._after = after
        self._last_made = now
        self.last_reason = reason
        self.stats.made[reason] += 1

    def _note_movement(self, current: torch.Tensor) -> None:
        if self._after is None:
            return
        moved = float(torch.linalg.vector_norm(current - self._after))
        self._after = current  # movement is counted once, from here on
        if moved > 0 and math.isfinite(moved):
            if self.movement == 0:
                self.movement = moved
                return
            # One jump (a rollback, an adopted model) must not set the scale: a μ far above
            # the steps that follow would hold back the rounds of a training node.
            moved = min(moved, MAX_RISE * self.movement)
            a = self.cfg.smoothing
            self.movement = (1 - a) * self.movement + a * moved

    def _due(self, now: float) -> str | None:
        """The rounds made whatever the state: the first, and the heartbeat."""
        if self._last_made is None:
            return "first"
        if now - self._last_made >= self.heartbeat_s:
            return "heartbeat"
        return None

    def _reason(
        self,
        current: torch.Tensor,
        state: GossipState,
        weights: Mapping[NodeId, float],
        gamma: float,
        now: float,
    ) -> str | None:
        due = self._due(now)
        if due is not None:
            return due
        bar = self.cfg.threshold * self.movement
        if float(torch.linalg.vector_norm(current - state.public)) > bar:
            return "movement"
        versions = _versions(state, weights)
        if versions == self._seen:
            return None  # the pull is what it was at the last look, which was not enough
        self._seen = versions
        if gamma * float(torch.linalg.vector_norm(_pull(state, weights))) > bar:
            return "news"
        return None


def _versions(state: GossipState, weights: Mapping[NodeId, float]) -> tuple[object, ...]:
    """What the mix's pull depends on: our public copy's version, and each weighed replica's."""
    out: list[object] = [state.session, state.seq]
    for peer in sorted(weights):
        replica = state.replicas.get(peer)
        if replica is not None:
            out += [peer, weights[peer], replica.session, replica.seq]
    return tuple(out)


def _pull(state: GossipState, weights: Mapping[NodeId, float]) -> torch.Tensor:
    """Σ_j w_ij (x̂_j - x̂_i), as :meth:`GossipState.consensus_step` adds it (before γ)."""
    pull = state.pull(weights)
    return pull if pull is not None else torch.zeros_like(state.public)
