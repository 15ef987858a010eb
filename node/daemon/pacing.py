"""The upload cap (``--max-upload-rate``): one token bucket for the bytes of every link
together, so that what the node sends stays under the cap over any window of a few seconds.

Models (deltas, snapshots, and the model a joiner pulls from this node) take tokens before they
go; membership messages do not, and keep
a reserved share of the cap instead (:data:`MEMBERSHIP_SHARE`), so that pings and acks never
wait behind a model and membership never starves. The tokens a message takes count what the
interface counts beyond the message itself (TCP/IP headers, HTTP/2 and TLS framing; ACKs of what
the node receives): :data:`WIRE_OVERHEAD`.

The bucket holds a quarter of a second of the models' rate: bytes sent over any window of T
seconds stay under the cap times T for T of a few seconds and more. One message bigger than the
bucket (a delta or snapshot of a large model under a small cap) waits until the bucket is full
and then goes at once, as the transport writes it; the debt it leaves holds the next messages
back. A model a joiner pulls goes in chunks of the bucket's size.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from gossip.budget import ByteBudget
from gossip.clock import Clock

__all__ = [
    "BUDGET_CHARGE",
    "MEMBERSHIP_SHARE",
    "MIN_UPLOAD_RATE",
    "WIRE_OVERHEAD",
    "Outflow",
    "UploadPacer",
]

#: Of the cap, kept for membership (SWIM's pings, acks and gossip of records).
MEMBERSHIP_SHARE = 0.1
#: Bytes on the interface per byte of model message: TCP/IP headers (52 per 1,448-byte segment,
#: 3.6%), HTTP/2 and TLS framing, acks of deltas, TCP ACKs of what the node receives. Measured
#: on the interfaces of four capped nodes over mutual TLS (tests/e2e/test_upload_cap.py),
#: membership included: 1.09-1.17.
WIRE_OVERHEAD = 1.15
#: What the byte budget charges per byte of model message: the wire's overhead, and
#: membership's share of the budget, as of the cap (membership itself is never held back, so a
#: node on a spent budget still answers SWIM). Measured on four budgeted nodes' interfaces
#: (tests/e2e/test_byte_budget.py): charged the overhead alone, they sent up to 12% over their
#: budget in a period; charged this, and a round's bytes reckoned before it is made
#: (gossip/mixing.py), 0.92-0.95 of it.
BUDGET_CHARGE = WIRE_OVERHEAD / (1 - MEMBERSHIP_SHARE)
#: The smallest cap accepted (bytes/s): membership alone needs a few kB/s.
MIN_UPLOAD_RATE = 16_000
#: Seconds of the models' rate the bucket holds.
BURST_S = 0.25


class UploadPacer:
    """Args:
    rate: the cap, bytes per second on the interface, all links together.
    clock, sleep: the runtime's (the loop's clock, and how the node's tasks wait).
    """

    def __init__(
        self, rate: float, clock: Clock, sleep: Callable[[float], Awaitable[None]]
    ) -> None:
        if rate < MIN_UPLOAD_RATE:
            raise ValueError(
                f"an upload cap of {rate:.0f} B/s is below {MIN_UPLOAD_RATE} B/s: membership "
                "alone needs a few kB/s"
            )
        self.rate = rate
        #: The models' share of the cap, in message bytes per second.
        self.model_rate = rate * (1 - MEMBERSHIP_SHARE) / WIRE_OVERHEAD
        self.capacity = self.model_rate * BURST_S
        #: The largest piece of a long message (a model served) to take at a time.
        self.chunk_bytes = int(self.capacity)
        self._clock = clock
        self._sleep = sleep
        self._tokens = self.capacity
        self._at = clock.now()
        #: Seconds links waited for tokens, in all (for figures).
        self.waited_s = 0.0

    def _refill(self) -> None:
        now = self._clock.now()
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.model_rate)
        self._at = now

    async def take(self, nbytes: int) -> None:
        """Wait until ``nbytes`` of model may go, and count them gone. Callers take in turn
        (one link's wait does not let another's smaller message jump the queue for long: each
        waits for tokens the bucket refills at the same rate)."""
        need = min(float(nbytes), self.capacity)
        while True:
            self._refill()
            if self._tokens >= need:
                self._tokens -= nbytes  # a message over the bucket leaves a debt
                return
            wait = (need - self._tokens) / self.model_rate
            self.waited_s += wait
            await self._sleep(wait)


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
        budget counted already (ByteBudget.claim, when the message was let go)."""
        if self.pacer is not None:
            await self.pacer.take(nbytes)
        if self.budget is not None and nbytes > claimed:
            self.budget.spend(nbytes - claimed)
