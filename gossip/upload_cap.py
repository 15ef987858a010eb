"""The upload cap (``--max-upload-rate``): one token bucket for the model bytes of every link of
a node together, so that what the node sends stays under the cap over any window of a few
seconds. The daemon (node/daemon/pacing.py) waits on it; the simulator (node/sim) delays the
send by what it says. Pure: it is told the time.

Models (deltas, snapshots, and the model a joiner pulls from this node) take tokens before they
go; membership messages do not, and keep a reserved share of the cap instead
(:data:`MEMBERSHIP_SHARE`), so that pings and acks never wait behind a model and membership
never starves. The tokens a message takes count what the interface counts beyond the message
itself (TCP/IP headers, HTTP/2 and TLS framing; ACKs of what the node receives):
:data:`WIRE_OVERHEAD`.

The bucket holds a quarter of a second of the models' rate: bytes sent over any window of T
seconds stay under the cap times T for T of a few seconds and more. One message bigger than the
bucket (a delta or snapshot of a large model under a small cap) waits until the bucket is full
and then goes at once, as the transport writes it; the debt it leaves holds the next messages
back. A model a joiner pulls goes in chunks of the bucket's size.

Messages are let go in the order they asked (:meth:`UploadCap.reserve` counts a message gone
when it asks, and says when it may go), so one link's large message cannot be overtaken for
ever by another's small ones; a message that is given up while it waits (its link closed) has
spent its tokens all the same.
"""

from __future__ import annotations

from gossip.budget import BudgetConfig

__all__ = [
    "BUDGET_CHARGE",
    "BURST_S",
    "MEMBERSHIP_SHARE",
    "MIN_UPLOAD_RATE",
    "WIRE_OVERHEAD",
    "UploadCap",
    "bound_rate",
]

#: Of the cap, kept for membership (SWIM's pings, acks and gossip of records).
MEMBERSHIP_SHARE = 0.1
#: Bytes on the interface per byte of model message: TCP/IP headers (52 per 1,448-byte segment,
#: 3.6%), HTTP/2 and TLS framing, acks of deltas, TCP ACKs of what the node receives. Measured
#: on the interfaces of four capped nodes over mutual TLS (tests/e2e/test_upload_cap.py),
#: membership included: 1.09-1.17.
WIRE_OVERHEAD = 1.15
#: What the byte budget (gossip/budget.py) charges per byte of model message: the wire's
#: overhead, and membership's share of the budget, as of the cap (membership itself is never
#: held back, so a node on a spent budget still answers SWIM). Measured on four budgeted nodes'
#: interfaces (tests/e2e/test_byte_budget.py): charged the overhead alone, they sent up to 12%
#: over their budget in a period; charged this, and a round's bytes reckoned before it is made
#: (gossip/mixing.py), 0.92-0.95 of it.
BUDGET_CHARGE = WIRE_OVERHEAD / (1 - MEMBERSHIP_SHARE)
#: The smallest cap accepted (bytes/s): membership alone needs a few kB/s.
MIN_UPLOAD_RATE = 16_000
#: Seconds of the models' rate the bucket holds.
BURST_S = 0.25


def _models_share(cap: float) -> float:
    """What of an upload cap (bytes a second on the interface) is for models, in message bytes
    a second: the cap less membership's share and the wire's overhead."""
    return cap * (1 - MEMBERSHIP_SHARE) / WIRE_OVERHEAD


def bound_rate(cap: float | None, budget: BudgetConfig | None) -> float | None:
    """Bytes of model message a second that an upload ``cap`` (bytes a second on the interface)
    and a byte ``budget`` let a node send on average, the lower of the two; None with neither."""
    rates = [] if cap is None else [_models_share(cap)]
    if budget is not None:
        rates.append(budget.nbytes / budget.period_s / BUDGET_CHARGE)
    return min(rates, default=None)


class UploadCap:
    """Args:
    rate: the cap, bytes per second on the interface, all links together.
    now: the time the bucket starts, full.
    """

    def __init__(self, rate: float, now: float) -> None:
        if rate < MIN_UPLOAD_RATE:
            raise ValueError(
                f"an upload cap of {rate:.0f} B/s is below {MIN_UPLOAD_RATE} B/s: membership "
                "alone needs a few kB/s"
            )
        self.rate = rate
        #: The models' share of the cap, in message bytes per second.
        self.model_rate = _models_share(rate)
        self.capacity = self.model_rate * BURST_S
        #: The largest piece of a long message (a model served) to take at a time.
        self.chunk_bytes = int(self.capacity)
        self._tokens = self.capacity  # below zero: what messages already let go still owe
        self._at = now
        #: Seconds messages waited for tokens, in all (for figures).
        self.waited_s = 0.0

    def reserve(self, nbytes: int, now: float) -> float:
        """When ``nbytes`` of model asking at ``now`` may go (``now`` or later), counted gone
        from then: at the moment the bucket, after the messages that asked before, holds them
        (or is full, for a message bigger than it; the rest is a debt)."""
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.model_rate)
        self._at = now
        need = min(float(nbytes), self.capacity)
        wait = max(0.0, (need - self._tokens) / self.model_rate)
        self._tokens -= nbytes
        self.waited_s += wait
        return now + wait
