"""A simulated node's local steps and gossip rounds, on the simulation's clock.

The counterpart of the daemon's trainer thread (node/daemon/trainer.py, whose ``train_step`` it
calls) and round scheduler (node/daemon/rounds.py, whose pacing it shares through
:class:`RoundPacer`): a step is an event ``step_s`` of simulated time after the last, a round is
made when it is due and the links can take it, and once the step budget is spent rounds go on
on a timer. A pause ends the chain of step (or idle round) events; a resume starts a new one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

import torch

from gossip.codec_choice import phase_of
from gossip.link import round_pace
from gossip.link_codecs import LinkCodecs
from gossip.messages import Delta
from gossip.mixing import Mixer
from gossip.pacing import RoundPacer
from gossip.replicas import GossipState
from node.daemon.trainer import train_step
from node.sim.link import SimLink
from node.sim.world import World
from node.tasks.base import Task
from node.telemetry.events import Counters

__all__ = ["SimTrainer", "TrainerOwner"]


class TrainerOwner(Protocol):
    """The simulated node that trains and gossips (node/sim/node.py ``SimNode``)."""

    @property
    def sim(self) -> World: ...

    @property
    def node_id(self) -> str: ...

    @property
    def task(self) -> Task: ...

    @property
    def step_s(self) -> float:
        """Simulated seconds per local step (the node's speed)."""
        ...

    @property
    def training(self) -> bool:
        """Up and past its wait for its links (steps and rounds stop when it is not)."""
        ...

    @property
    def links(self) -> dict[str, SimLink]: ...

    @property
    def degree(self) -> int: ...

    @property
    def state(self) -> GossipState: ...

    @property
    def mixer(self) -> Mixer: ...

    @property
    def model(self) -> torch.Tensor:
        """x, flat: what a step trains and a round mixes."""
        ...

    @property
    def counters(self) -> Counters: ...

    @property
    def codecs(self) -> LinkCodecs | None:
        """Under ``--compress auto``, each link's codec from its meter (None: one codec)."""
        ...


class SimTrainer:
    """Args:
    owner: the node.
    batches: endless batches of the node's shard.
    """

    def __init__(self, owner: TrainerOwner, batches: Iterator[tuple[torch.Tensor, ...]]) -> None:
        cfg = owner.sim.cfg
        g = cfg.gossip
        self.owner = owner
        self.sim = owner.sim
        self.optimizer = owner.task.make_optimizer()
        self.schedule = owner.task.make_schedule(self.optimizer, cfg.steps)
        self._batches = batches
        self.pacer = RoundPacer(g.local_steps, g.max_local_steps)
        self.step = 0
        self.loss = float("nan")
        #: Every neighbour this node's anomaly score evicted, once per eviction (robust mixing).
        self.evictions: list[str] = []
        # Each pause ends the chain of step (or idle round) events; a resume starts a new one.
        self._chain = 0

    def go_on(self) -> None:
        """Start a chain of steps, or of idle rounds once the step budget is spent."""
        budget = self.sim.cfg.steps
        if budget is not None and self.step >= budget:  # gossip alone, as a spent node
            self._next_idle_round()
        else:
            self._after(self.owner.step_s, self._local_step)

    def halt(self) -> None:
        """End the chain: the steps (or idle rounds) already on the queue come to nothing."""
        self._chain += 1

    def _after(self, delay_s: float, what: Callable[[], None]) -> None:
        """``what`` in ``delay_s``, unless a pause comes first."""
        chain = self._chain

        def fire() -> None:
            if chain == self._chain:
                what()

        self.sim.events.after(delay_s, fire)

    def _local_step(self) -> None:
        owner = self.owner
        if not owner.training:
            return
        budget = self.sim.cfg.steps
        if self.pacer.held(self.step):
            self.try_round()
            if self.pacer.held(self.step):
                # Held at the bound on local steps (node/daemon/rounds.py). The daemon is
                # released the moment its links go idle; here a link turns idle by time as
                # well as by events, so the node looks again a step's time later: its hold
                # lasts at most one step longer than the daemon's would.
                owner.counters.held_s += owner.step_s
                self._after(owner.step_s, self._local_step)
                return
        inputs, targets = next(self._batches)
        self.loss = train_step(owner.task, self.optimizer, inputs, targets, self.schedule)
        self.step += 1
        if self.pacer.due(self.step):
            self.try_round()
        if budget is None or self.step < budget:
            self._after(owner.step_s, self._local_step)
        else:
            self._next_idle_round()

    def _next_idle_round(self) -> None:
        interval_s = self.sim.cfg.gossip.idle_round_interval_s
        if interval_s is not None:  # None: no rounds once training is over, as the daemon
            self._after(interval_s, self._idle_round)

    def _idle_round(self) -> None:
        """After training: keep mixing toward the swarm, on a timer, as the daemon does."""
        if not self.owner.training:
            return
        self.try_round(training=False)
        self._next_idle_round()

    def try_round(self, training: bool = True) -> bool:
        """Make a round when the links can take it (``round_pace``, RoundPacer); offer it to
        every link, or with a copy per link each ready link its own delta. ``training``: a
        round of the steps (the last step's too, as in the daemon, whose trainer is not done
        until it has evaluated), not an idle round after them.

        The daemon tells the pacer whenever a link may have turned busy or idle; here nothing
        happens between two events, so asking the links when a round is due is the same.
        """
        owner = self.owner
        state, links, codecs = owner.state, owner.links, owner.codecs
        machines = {peer: link.machine for peer, link in links.items()}
        idle, ready = round_pace(machines, self.sim.events.now(), state.per_link)
        self.pacer.links_idle = idle
        if not self.pacer.begin(self.step):
            return False
        if codecs is not None:
            meters = {peer: m.meter for peer, m in machines.items()}
            compute_s = owner.step_s * self.sim.cfg.gossip.local_steps
            now = self.sim.events.now()
            phase = phase_of(not training, owner.mixer.quiet)
            if state.per_link:
                state.set_link_codecs(codecs.update(meters, compute_s, now, phase))
            else:
                state.set_round_codec(codecs.update_all(meters, compute_s, now, phase))
        try:
            made = owner.mixer.round(owner.model, ready=ready)
            if made is None:
                return False
            owner.counters.rounds += 1
            self.evictions.extend(made.newly_evicted)
            session, step, degree = state.session, self.step, owner.degree
            if made.links:
                for peer, (seq, payload) in made.links.items():
                    links[peer].offer(Delta(owner.node_id, session, seq, step, payload, degree))
                return True
            delta = Delta(owner.node_id, session, made.seq, step, made.payload, degree)
            for link in list(links.values()):
                link.offer(delta)
            return True
        finally:
            self.pacer.end()
