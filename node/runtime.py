"""The one source of time and randomness for a node's shell, injected as :mod:`gossip` injects it.

A daemon's parts read the time from ``runtime.clock``, wait with ``runtime.sleep`` and draw from
``runtime.rng``, never from :mod:`time` or the global :mod:`random`. The clock is the event loop's
own (:meth:`asyncio.AbstractEventLoop.time`), so timers armed on the loop (``asyncio.timeout``,
``call_at``) and the clock the parts read agree; a test that runs the node on a loop whose time is
virtual therefore runs every part on virtual time, and one seed makes its choices repeatable.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gossip.clock import Clock

__all__ = ["LoopClock", "Runtime", "SystemClock", "WallClock"]


class LoopClock:
    """The time of one event loop. Safe to read from any thread (the gossip worker reads it)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def now(self) -> float:
        return self._loop.time()


class SystemClock:
    """The monotonic clock, for parts that may run before a loop does or off it (the gRPC
    transport's channel expiry and its servicer's bans). On the default event loop it reads
    what the loop's clock reads."""

    def now(self) -> float:
        return time.monotonic()


class WallClock:
    """Seconds since the Unix epoch: for what must agree with the calendar and survive a restart
    (a byte budget's period turns at 00:00 UTC), never for timeouts."""

    def now(self) -> float:
        return time.time()


@dataclass(frozen=True)
class Runtime:
    """Args:
    clock: what every part of the node reads the time from.
    sleep: how the node's tasks wait (``asyncio.sleep`` on the loop whose time ``clock`` reads).
    rng: every random choice of the node's shell: jitter, shuffles, session ids, rounding seeds.
    """

    clock: Clock
    sleep: Callable[[float], Awaitable[None]]
    rng: random.Random

    @classmethod
    def on_loop(
        cls, loop: asyncio.AbstractEventLoop | None = None, seed: int | None = None
    ) -> Runtime:
        """The runtime of a node on ``loop`` (the running one by default); ``seed`` None draws
        from the operating system, as a daemon should."""
        return cls(
            LoopClock(loop or asyncio.get_running_loop()), asyncio.sleep, random.Random(seed)
        )

    def fork_rng(self) -> random.Random:
        """An RNG of its own for a part (a link's jitter), drawn from this one: a part's draws then
        do not shift another's, and one seed still fixes them all."""
        return random.Random(self.rng.getrandbits(64))
