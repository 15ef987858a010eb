"""What every model byte a node sends goes through: the upload cap (gossip/upload_cap.py's token
bucket, waited on here) and the byte budget (gossip/budget.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from gossip.budget import ByteBudget
from gossip.clock import Clock
from gossip.upload_cap import (
    BUDGET_CHARGE,
    BURST_S,
    MEMBERSHIP_SHARE,
    MIN_UPLOAD_RATE,
    WIRE_OVERHEAD,
    UploadCap,
)

__all__ = [
    "BUDGET_CHARGE",
    "BURST_S",
    "MEMBERSHIP_SHARE",
    "MIN_UPLOAD_RATE",
    "WIRE_OVERHEAD",
    "Outflow",
    "UploadPacer",
]


class UploadPacer(UploadCap):
    """The upload cap as the daemon's links wait on it.

    Args:
        rate: the cap, bytes per second on the interface, all links together.
        clock, sleep: the runtime's (the loop's clock, and how the node's tasks wait).
    """

    def __init__(
        self, rate: float, clock: Clock, sleep: Callable[[float], Awaitable[None]]
    ) -> None:
        super().__init__(rate, clock.now())
        self._clock = clock
        self._sleep = sleep

    async def take(self, nbytes: int) -> None:
        """Wait until ``nbytes`` of model may go, and count them gone."""
        now = self._clock.now()
        at = self.reserve(nbytes, now)
        if at > now:
            await self._sleep(at - now)


class Outflow:
    """What every model byte the node sends goes through: the upload cap, which may make it
    wait, and the byte budget (gossip/budget.py), which counts it with the wire's overhead and
    membership's share (its charge, :data:`BUDGET_CHARGE`). Membership passes neither: it is
    never held back, so that a node on a spent budget still answers SWIM and is not taken for
    dead.

    Args:
        pacer: the upload cap (None: none).
        budget: the byte budget (None: none).
    """

    def __init__(self, pacer: UploadPacer | None, budget: ByteBudget | None) -> None:
        self.pacer = pacer
        self.budget = budget

    @property
    def chunk_bytes(self) -> int | None:
        """The largest piece of a long message to take at a time (None: no cap, any)."""
        return None if self.pacer is None else self.pacer.chunk_bytes

    async def take(self, nbytes: int, claimed: int = 0) -> None:
        """Wait until ``nbytes`` of model may go, and count them gone; ``claimed`` of them the
        budget counted already (ByteBudget.claim, when the message was let go). A claim for
        more than goes (a whole model's, for a snapshot that went by name) is given back."""
        if self.pacer is not None:
            await self.pacer.take(nbytes)
        if self.budget is not None and nbytes != claimed:
            self.budget.spend(nbytes - claimed)
