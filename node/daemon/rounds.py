"""The round scheduler: when a node makes a gossip round.

Gossip rounds follow the trainer's steps (at least ``local_steps`` apart, and only when the
links have carried the previous round) and, once the step budget is spent, a slow timer, so that
a finished node keeps pulling toward the swarm and serving its model until it is stopped.
With ``max_local_steps`` set, a trainer that reaches that many steps since the last round began
is held (it waits, taking no steps) until the links can take the next round, so that a fast
device on a slow link does not wander arbitrarily far from its neighbours between averagings.

The pacing (gossip/pacing.py :class:`RoundPacer`) is shared by the trainer thread, which asks
after each step, and the event loop, which learns when links go busy or idle; hence the lock.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Protocol

from gossip.messages import Delta
from gossip.pacing import RoundPacer
from node.daemon.signals import Signals
from node.runtime import Runtime
from node.telemetry.events import Counters

__all__ = ["RoundScheduler"]


#: A round's deltas: one for every link, or (a copy per link) each link's own, by neighbour.
Made = Delta | Mapping[str, Delta]


class Worker(Protocol):
    """Makes a round where the gossip state lives (node/daemon/gossiper.py)."""

    def submit_round(self, step: int, ready: frozenset[str]) -> Future[Made | None]: ...


class Links(Protocol):
    """The node's outgoing links (node/daemon/peers.py)."""

    def pace(self) -> tuple[bool, frozenset[str]]: ...

    def offer(self, delta: Made) -> None: ...


class Steps(Protocol):
    """The trainer, as far as rounds care (node/daemon/trainer.py)."""

    @property
    def step(self) -> int: ...

    @property
    def running(self) -> bool: ...

    def hold(self) -> None: ...

    def release(self) -> None: ...


class RoundScheduler:
    """Args:
    local_steps: the least number of steps between two rounds.
    max_local_steps: the most: the trainer is held there until a round begins. None: no bound.
    worker: makes the rounds.
    links: carries them, and says whether it still carries the last one.
    trainer: the step an idle round is made at, and whether training runs.
    counters: counts the rounds made.
    signals: told of every round made, and of a round that failed (the node fails).
    runtime: how the idle rounds wait, and the clock rounds are timed on.
    """

    def __init__(
        self,
        local_steps: int,
        worker: Worker,
        links: Links,
        trainer: Steps,
        counters: Counters,
        signals: Signals,
        runtime: Runtime,
        max_local_steps: int | None = None,
    ) -> None:
        self.worker = worker
        self.links = links
        self.trainer = trainer
        self.counters = counters
        self.signals = signals
        self.sleep = runtime.sleep
        self.clock = runtime.clock
        self._lock = threading.Lock()
        self._pacer = RoundPacer(local_steps, max_local_steps)
        # Whether the trainer is held, and since when (clock seconds); under the lock, with
        # the trainer's hold and release, so that a release cannot come before its hold.
        self._holding = False
        self._held_since = 0.0
        # The links the next round goes to, as the event loop last found them (a copy per
        # link: the ones not busy; under the lock).
        self._ready: frozenset[str] = frozenset()

    def after_step(self, step: int) -> None:
        """Trainer thread: start a gossip round if one is due and the links can take it;
        hold the trainer if none could begin and the bound on local steps is reached."""
        with self._lock:
            due = self._pacer.due(step)
        if not due or self.try_round(step):
            return
        with self._lock:
            if self._holding or not self._pacer.held(step):
                return
            self._holding = True
            self._held_since = self.clock.now()
            self.trainer.hold()
        self._retry_held()  # the links may have gone idle since the round was refused

    @property
    def holding(self) -> bool:
        """Whether the trainer waits for the next round (the bound on local steps)."""
        return self._holding

    def _retry_held(self) -> None:
        """Begin the round a held trainer waits for, and release it, if the links take it."""
        if not self._holding or not self.try_round(self.trainer.step):
            return
        with self._lock:
            self._release()

    def _release(self) -> None:
        """Under the lock: release the trainer, unless another thread's round did already."""
        if self._holding:
            self._holding = False
            self.counters.held_s += self.clock.now() - self._held_since
            self.trainer.release()

    def try_round(self, step: int) -> bool:
        """Start a round unless one is being made or a link is still busy; never blocks.

        Rounds are paced by the network: ``local_steps`` is the least number of steps between
        two rounds, and a round is skipped while the links still carry the last one. Skipping
        loses nothing (x - x̂ keeps what was not sent), whereas queueing rounds that the network
        cannot carry would only make every neighbour's replica staler.
        """
        with self._lock:
            if not self._pacer.begin(step):
                return False
            ready = self._ready
        began = self.clock.now()
        fut = self.worker.submit_round(step, ready)
        fut.add_done_callback(self.signals.on_loop(functools.partial(self._round_made, began)))
        return True

    def links_changed(self) -> None:
        """Event loop: a link may have become busy or idle."""
        idle, ready = self.links.pace()
        with self._lock:
            self._pacer.links_idle = idle
            self._ready = ready
        if idle:
            self._retry_held()
        if not self.trainer.running:
            self.signals.changed()  # the start of training waits for links to come up

    def _round_made(self, began: float, fut: Future[Made | None]) -> None:
        try:
            if fut.cancelled():
                return
            err = fut.exception()
            if err is not None:
                self.signals.fail(err)
                return
            delta = fut.result()
            if delta is None:
                self.counters.rounds_skipped += 1
                return
            self.counters.rounds += 1
            self.counters.histograms.round_seconds.observe(self.clock.now() - began)
            self.signals.changed()
            self.links.offer(delta)
        finally:
            with self._lock:
                self._pacer.end()
            self.links_changed()

    async def idle_gossip(self, interval_s: float) -> None:
        """After training: keep mixing toward the swarm, every ``interval_s``, until stopped."""
        while True:
            self.try_round(self.trainer.step)
            await self.sleep(interval_s)
