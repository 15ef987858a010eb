"""The decisions of a gossip round that the daemon and the simulator share.

A node's round (mix, then send: plain, Byzantine-robust or as an attacker, with DiLoCo's outer
step or without; a scheduled round sends first), over gossip/choco.py's weights and mix. When
a node makes a round at all is gossip/pacing.py's. The
daemon (``node/daemon/gossiper.py``, ``node/daemon/rounds.py``) runs these on its threads and
event loop; the simulator (``node/sim``) on simulated time. A :class:`Mixer` is one node's
rounds; it keeps what the rounds decide (who is out of the mix for silence, who is evicted for
anomalous deltas), and only a round changes it: reading it (a status) never does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping

import torch

from gossip.budget import ByteBudget
from gossip.choco import convex_steps, mix, mixing_weights
from gossip.codecs import Codec, Encoded
from gossip.mix_types import MixConfig, NodeId, Round
from gossip.outer import OuterNesterov
from gossip.replicas import GossipState
from gossip.robust import NeighbourScores, attack_target, clipped_consensus_step
from gossip.schedules import LinkPlan, LinkSchedule
from gossip.trigger import RoundTrigger

__all__ = ["MixConfig", "Mixer", "Round"]


class Mixer:
    """One node's gossip rounds over its :class:`GossipState`, whose peers are its neighbours.

    Not thread-safe, like the state: the daemon calls it on its gossip worker only.

    Args:
        outer: DiLoCo's outer step on each round's local change, before its mix (None: plain
            gossip).
        attack_generator: the randomness of the ``random``, ``huge`` and ``spike`` attacks.
        budget: the node's byte budget (gossip/budget.py): while it is ahead of its allowance,
            only heartbeat rounds are made. Needs ``cfg.trigger``. The links spend it.
    """

    def __init__(
        self,
        state: GossipState,
        cfg: MixConfig,
        outer: OuterNesterov | None = None,
        attack_generator: torch.Generator | None = None,
        budget: ByteBudget | None = None,
    ) -> None:
        if state.per_link and (cfg.robust or cfg.attack is not None):
            raise ValueError(
                "a copy per link (--pace link) mixes with plain CHOCO only: robust mixing and "
                "the test attacks score one public copy"
            )
        if cfg.schedule is not None and not state.per_link:
            raise ValueError(
                f"the {cfg.schedule.kind} schedule sends each round to some links only, which "
                "needs a copy of the model per link (--pace link)"
            )
        if budget is not None and cfg.trigger is None:
            raise ValueError(
                "a byte budget needs the event-triggered rule: once spent, the node makes "
                "only its heartbeat rounds"
            )
        self.state = state
        self.cfg = cfg
        self.outer = outer
        self.budget = budget
        self._attack_rng = attack_generator or torch.Generator(state.device).manual_seed(0)
        self.scores = (
            NeighbourScores(byzantine_fraction=cfg.byzantine_fraction) if cfg.robust else None
        )
        self._silenced: frozenset[NodeId] = frozenset()
        self._evicted: frozenset[NodeId] = frozenset()
        #: With a copy per link: each neighbour's replica version at the last mix with it.
        self._mixed: dict[NodeId, tuple[int, int]] = {}
        #: Which of the ready links each link round goes to (bridges' periods, a schedule).
        self.schedule = LinkSchedule(cfg.schedule)
        #: The event-triggered rule (None: off, every round is made).
        self.trigger = (
            RoundTrigger(cfg.trigger, cfg.trigger.heartbeat_for(cfg.silence_limit_s))
            if cfg.trigger is not None
            else None
        )

    @property
    def neighbours(self) -> frozenset[NodeId]:
        return self.state.peers

    @property
    def silenced(self) -> frozenset[NodeId]:
        """Neighbours out of the mix, as the last round found them, for their silence."""
        return self._silenced

    @property
    def evicted(self) -> frozenset[NodeId]:
        """Neighbours out of the mix, as the last round found them, for their anomaly score."""
        return self._evicted

    def set_neighbours(
        self, neighbours: frozenset[NodeId], plan: LinkPlan | None = None
    ) -> frozenset[NodeId]:
        """Mix with exactly these neighbours; returns those dropped (their replicas too).

        Args:
            plan: what the topology says of each link (gossip/schedules.py): the one-peer
                schedule's classes, a period and a codec per bridge between regions. Its
                periods and codecs need a copy per link, and its codecs ``auto``'s codec set.
        """
        plan = plan or LinkPlan()
        self.schedule.set_plan(plan, neighbours)
        gone = self.state.set_peers(neighbours)
        self.state.set_link_codecs(plan.codecs)
        if self.scores is not None:
            self.scores.forget(gone)
        self._silenced &= neighbours
        self._evicted &= neighbours
        for peer in gone:
            self._mixed.pop(peer, None)
        return gone

    @property
    def quiet(self) -> bool:
        """Whether the node's rounds have fallen to heartbeats: its last round was one (the
        trigger found nothing else worth its bytes). Never without a trigger."""
        return self.trigger is not None and self.trigger.last_reason == "heartbeat"

    def weights(self) -> dict[NodeId, float]:
        """The weights a round would mix with now (evicted neighbours left out). A read: it
        changes nothing, so a status may call it as often as it likes."""
        return self._mix_weights(self.neighbours)

    def round(
        self,
        x: torch.Tensor,
        lock: contextlib.AbstractContextManager[object] | None = None,
        ready: Iterable[NodeId] | None = None,
    ) -> Round | None:
        """One round: the mix into ``x``, then q = Q(target - x̂), x̂ += q (CHOCO-Gossip,
        Koloskova et al. 2019, Algorithm 1, made asynchronous, mixing first as
        :func:`gossip.choco.mix_and_send` says why; ClippedGossip's mix with ``robust``, He et
        al. 2022;
        DiLoCo's outer step before it, on the local steps' change, Douillard et al. 2023). The
        target is ``x``, or for an attacker what it publishes instead. None without neighbours
        (a new neighbour starts from a snapshot, so skipping costs nothing), and None when the
        trigger finds the round not worth its bytes: then nothing changes (x - x̂ keeps the
        unsent change, the sequence numbers continue at the next round made).

        Args:
            lock: held while ``x`` is read and while it is written, not while compressing (the
                daemon's trainer steps on another thread in between).
            ready: with a copy per link, the links that can carry a delta now (see
                :meth:`_link_round`); ignored otherwise.
        """
        neighbours = self.neighbours
        if not neighbours:
            return None
        if self.state.per_link:
            return self._link_round(x, lock, frozenset(ready or ()) & neighbours)
        cfg, state = self.cfg, self.state
        guard = lock if lock is not None else contextlib.nullcontext()
        with guard:
            current = x.clone()
        if cfg.attack is not None:
            target = attack_target(cfg.attack, current, self._attack_rng)
            seq, payload = state.make_delta(target)
            nobody: dict[NodeId, float] = {}
            return Round(
                seq, payload, nobody, self._silenced, self._evicted, {}, frozenset(), {}, {}
            )
        reason = self._worth(current, neighbours, [state.codec_for(p) for p in neighbours])
        if reason is None:
            return None
        newly_evicted: dict[NodeId, float] = {}
        readmitted: dict[NodeId, float] = {}
        if self.scores is not None:
            evicted = self.scores.update(state, neighbours)
            score = self.scores.anomaly.scores
            newly_evicted = {p: score[p] for p in sorted(evicted - self._evicted)}
            readmitted = {p: score[p] for p in sorted((self._evicted - evicted) & neighbours)}
            self._evicted = evicted
        weights = mixing_weights(state, neighbours, len(neighbours), cfg.silence_limit_s)
        went_silent, spoke_again = self._note_silence(neighbours, weights)
        with guard:
            if self.scores is not None:
                if self.outer is not None:
                    self.outer.step(x)
                clipped_consensus_step(
                    state,
                    x,
                    self._robust_gamma(weights),
                    weights,
                    cfg.byzantine_fraction,
                    self._evicted,
                )
                if self.outer is not None:
                    self.outer.rebase(x)
            else:
                mix(state, x, cfg.gamma, self._pair_steps(weights), self.outer)
            current = x.clone()
        seq, payload = state.make_delta(current)  # compression runs outside the lock
        if self.trigger is not None:
            self.trigger.made(current, state.clock.now(), reason)
        return Round(
            seq,
            payload,
            weights,
            self._silenced,
            self._evicted,
            went_silent,
            spoke_again,
            newly_evicted,
            readmitted,
            reason,
        )

    def _link_round(
        self,
        x: torch.Tensor,
        lock: contextlib.AbstractContextManager[object] | None,
        ready: frozenset[NodeId],
    ) -> Round | None:
        """A round with a copy per link (gossip/pairwise.py, made asynchronous): first the mix
        over the ready links whose neighbour's replica moved since this node last mixed with
        it, then a delta on each link the round goes to, q_j = Q(x - x̂_ij), x̂_ij += q_j.

        The mix comes first so that each link's pull, x̂_ji - x̂_ij, is the difference of the
        two copies as both ends hold them: a ready link carries no delta (or, in the daemon's
        window, one), so x̂_ij is what the neighbour has. The pulls of the two ends of a link
        are then opposite and the swarm's mean moves only by training. Mixing against this
        round's copy instead (ahead of the neighbour's by the delta in flight) would take back
        a share of every local step: the mean would move at 1 / (1 + γ Σ_j w_ij) of the
        training's pace (measured on the text task: 9% higher loss at γ = 1). A link mixes
        each new replica once, at the first round after it arrived. A schedule's round
        (one-peer, epidemic) is the exception, below: it sends first. A link that did not send
        keeps its unsent change in x - x̂_ij for its next delta (a slow link carries many
        rounds' change in one message, and does not hold up the others). None when no link is
        ready, or when the trigger finds the round not worth its bytes."""
        cfg, state = self.cfg, self.state
        neighbours = self.neighbours
        linked = frozenset(p for p in ready if p in state.copies)
        ready = self.schedule.due(linked)
        if not ready:
            return None
        guard = lock if lock is not None else contextlib.nullcontext()
        with guard:
            current = x.clone()
        scheduled = self.schedule.pick(ready)
        reason = self._worth(current, neighbours, [state.codec_for(p) for p in scheduled])
        if reason is None:
            return None
        if reason != "heartbeat":
            # A heartbeat goes to every ready link: one link in a cycle of classes would
            # hear from this node only every τ heartbeats, past its silence limit.
            ready = scheduled
        every = mixing_weights(state, neighbours, len(neighbours), cfg.silence_limit_s)
        went_silent, spoke_again = self._note_silence(neighbours, every)
        # The schedule's weight, for a round that went to its links; a heartbeat to every
        # link mixes at Metropolis weights, whose sum stays below one.
        pairs = None
        if self.cfg.schedule is not None and reason != "heartbeat":
            pairs = self.cfg.schedule.weight
        # A schedule's round sends first and mixes the links it went to against the copy
        # just sent. Its links exchange one round in several, so the copies both ends hold
        # are rounds old, and adding their difference to x (mixed by the other links since)
        # is a delayed feedback at the schedule's weight of 1/3: measured at 64 nodes in the
        # daemon's simulator, one-peer diverged. Pulling toward the neighbour's copy from
        # where x is now is a convex step, stable whatever the delay. A copy that arrived on
        # a link this round does not go to is pulled toward the same way, at this round
        # rather than at its link's next one (Epidemic Learning averages what it received
        # with its current model): the neighbour's copy is then a round old, not up to a
        # cycle of classes, and each pull toward an older copy takes back more of this
        # node's training since (text, one-peer, int8 at γ 0.8: 2.4% lower loss).
        fresh = self.cfg.schedule is not None
        links = self._send(ready, current) if fresh else {}
        weights: dict[NodeId, float] = {}
        arrived: dict[NodeId, float] = {}
        for peer, w in every.items():
            replica = state.replicas[peer]
            version = (replica.session, replica.seq)
            if self._mixed.get(peer) == version:
                continue
            if peer in (links if fresh else linked):
                weights[peer] = w if pairs is None else pairs
            elif fresh:
                arrived[peer] = w if pairs is None else pairs
            else:
                continue
            self._mixed[peer] = version
        steps, toward = self._pair_steps(weights), self._pair_steps(arrived)
        if fresh:
            steps, toward = convex_steps(cfg.gamma, steps, toward)
        with guard:
            mix(state, x, cfg.gamma, steps, self.outer, toward)
            after = x.clone()
        weights.update(arrived)
        if not fresh:
            current = after
            links = self._send(ready, current)
        state.note_model(current)
        self.schedule.made(scheduled, links)
        if self.trigger is not None:
            self.trigger.made(after, state.clock.now(), reason)
        first = min(links)
        return Round(
            links[first][0],
            links[first][1],
            weights,
            self._silenced,
            self._evicted,
            went_silent,
            spoke_again,
            {},
            {},
            reason,
            links,
        )

    def _send(
        self, ready: frozenset[NodeId], current: torch.Tensor
    ) -> dict[NodeId, tuple[int, Encoded]]:
        """A delta of ``current`` on each link of ``ready``: q_j = Q(current - x̂_ij)."""
        links: dict[NodeId, tuple[int, Encoded]] = {}
        for peer in sorted(ready):
            made = self.state.make_link_delta(peer, current)
            if made is not None:
                links[peer] = made
        return links

    def _pair_steps(self, weights: Mapping[NodeId, float]) -> Mapping[NodeId, float]:
        """The weights, each scaled by its pair's γ under ``auto`` (``link_gamma``)."""
        gammas = self.cfg.link_gamma
        if gammas is None:
            return weights
        return {p: w * self._pair_gamma(p, gammas) for p, w in weights.items()}

    def _robust_gamma(self, weights: Mapping[NodeId, float]) -> float:
        """The one γ of a clipped step: ``gamma``, or under ``auto`` the smallest of the pairs'
        (clipping weighs every pull against one radius, so the pulls share one step)."""
        if self.cfg.link_gamma is None:
            return self.cfg.gamma
        pairs = [
            self._pair_gamma(p, self.cfg.link_gamma) for p in weights if p in self.state.replicas
        ]
        return self.cfg.gamma * min(pairs, default=min(self.cfg.link_gamma.values()))

    def _pair_gamma(self, peer: NodeId, gammas: Mapping[str, float]) -> float:
        """The γ of the link to ``peer``: the smaller of its two directions' codecs'; before
        the neighbour's first delta names its codec, the smallest of all, which the other end
        also uses until it hears ours (a snapshot names no codec)."""
        theirs = self.state.replicas[peer].codec
        if not theirs:
            return min(gammas.values())
        return min(gammas[self.state.codec_for(peer).name], gammas[theirs])

    def _worth(
        self, current: torch.Tensor, neighbours: frozenset[NodeId], deltas: list[Codec]
    ) -> str | None:
        """Why a round of a delta by each of ``deltas`` is worth making (the trigger's
        reason, "always" without it), or None when it is not."""
        if self.trigger is None:
            return "always"
        hold = False
        if self.budget is not None:
            # What the round would send (the wire adds a few bytes of header, and the budget
            # its charge).
            upcoming = sum(c.encoded_nbytes(self.state.numel) for c in deltas)
            hold = self.budget.ahead(upcoming)
        weights = self._mix_weights(neighbours)
        return self.trigger.decide(current, self.state, weights, self.cfg.gamma, hold)

    def _mix_weights(self, neighbours: frozenset[NodeId]) -> dict[NodeId, float]:
        weights = mixing_weights(self.state, neighbours, len(neighbours), self.cfg.silence_limit_s)
        return {p: w for p, w in weights.items() if p not in self._evicted}

    def _note_silence(
        self, neighbours: frozenset[NodeId], weights: Mapping[NodeId, float]
    ) -> tuple[dict[NodeId, float], frozenset[NodeId]]:
        """Who leaves the mix for their silence (with how long), and who is back in it."""
        silenced = set(self._silenced)
        went: dict[NodeId, float] = {}
        back = set()
        for peer in neighbours:
            silent = self.state.silent_for(peer)
            if silent is None:
                continue  # no replica yet: out of the mix, but not for its silence
            if peer not in weights:
                if peer not in silenced:
                    silenced.add(peer)
                    went[peer] = silent
            elif peer in silenced:
                silenced.discard(peer)
                back.add(peer)
        self._silenced = frozenset(silenced) & neighbours
        return went, frozenset(back)
