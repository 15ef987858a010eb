"""When a node makes a gossip round (:class:`RoundPacer`); the daemon (``node/daemon/rounds.py``)
and the simulator (``node/sim``) both ask it, and gossip/mixing.py makes the round."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RoundPacer"]


@dataclass
class RoundPacer:
    """When a node makes a gossip round: at least ``local_steps`` training steps after the last
    one, never while one is being made, and only while no healthy link is busy.

    Rounds are paced by the network: skipping one loses nothing (x - x̂ keeps what was not
    sent), whereas queueing rounds that the network cannot carry would only make every
    neighbour's replica staler. So the local steps between two rounds adapt by themselves: a
    node whose steps are fast next to its links takes many, a slow one takes ``local_steps``.
    ``max_local_steps`` bounds them: once that many steps passed since the last round began,
    the node is :meth:`held` (its trainer waits) until the next round can begin, so that a fast
    device on a slow link does not drift arbitrarily far from its neighbours between rounds
    (local SGD's error grows with the steps between averagings). None: no bound.
    Not thread-safe: the daemon holds a lock around it.
    """

    local_steps: int
    max_local_steps: int | None = None
    last_round_step: int = 0
    making: bool = False
    links_idle: bool = True

    def __post_init__(self) -> None:
        if self.local_steps < 1:
            raise ValueError(f"local_steps must be at least 1, got {self.local_steps}")
        if self.max_local_steps is not None and self.max_local_steps < self.local_steps:
            raise ValueError(
                f"max_local_steps ({self.max_local_steps}) must be at least local_steps "
                f"({self.local_steps})"
            )

    def due(self, step: int) -> bool:
        """Whether enough steps passed since the last round for another."""
        return step - self.last_round_step >= self.local_steps

    def held(self, step: int) -> bool:
        """Whether the trainer must wait at ``step`` until a round begins: the bound is
        reached. A round being made or a busy link is what keeps it waiting."""
        bound = self.max_local_steps
        return bound is not None and step - self.last_round_step >= bound

    def begin(self, step: int) -> bool:
        """Start a round at ``step`` unless one is being made or a link is busy."""
        if self.making or not self.links_idle:
            return False
        self.making = True
        self.last_round_step = step
        return True

    def end(self) -> None:
        self.making = False
