"""The one inbound path: a delta or a snapshot checked, applied and counted, for both runtimes.

The daemon's service (node/daemon/service.py, behind the gRPC and the in-memory transports) and the
simulator's node (node/sim/node.py) both take gossip through an :class:`Inbound`: the node's
common checks (is it taking messages, is the sender banned or flooding, does it speak our
protocol), then the state machine's (gossip/replicas.py: sender, session, sequence, codec,
values; nothing changes unless all pass), then the counting. A refusal raises
:class:`Rejected` with its reason, is counted under it, and counts against the sender when the
message was bad in itself (gossip/refusals.py, node/security/penalties.py).

The state machine's part runs where the gossip state lives: each method is a generator of
:data:`node.daemon.steps.Steps` that yields that work (see node/daemon/steps.py), so one piece of
code serves the daemon's worker thread and the simulator's single thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NoReturn

import torch

from gossip.clock import Clock
from gossip.codecs import CodecError
from gossip.digest import find_model
from gossip.messages import PROTOCOL_VERSION, Delta, SnapshotHeader
from gossip.refusals import Reason, reason_of
from gossip.replicas import GossipError, GossipState
from node.daemon.steps import Steps
from node.security.penalties import Penalties, PenaltyConfig, RateConfig, RateLimiter
from node.telemetry.events import Counters
from node.transport.base import Rejected

__all__ = ["Inbound"]

log = logging.getLogger(__name__)

_NOT_TAKING = {
    Reason.SHUTTING_DOWN: "this node is shutting down",
    Reason.NOT_READY: "this node is still starting",
}


class Inbound:
    """Args:
    state: the gossip state; touched only in the work the methods yield.
    counters: the node's totals: refusals by reason, bytes received (by sender too).
    clock: the time of bans and of the rate limits.
    accepting: why the node takes no messages now (``SHUTTING_DOWN``, ``NOT_READY``), or None.
    on_replicas: called where the state lives after a snapshot replaced a replica (the daemon
        publishes which replicas it holds to its event loop).
    """

    def __init__(
        self,
        state: GossipState,
        counters: Counters,
        clock: Clock,
        accepting: Callable[[], Reason | None] = lambda: None,
        on_replicas: Callable[[], None] = lambda: None,
    ) -> None:
        self.state = state
        self.counters = counters
        #: Who is kept out for sending bad messages; public so that tests can give it a clock.
        self.penalties = Penalties(PenaltyConfig(), clock)
        #: How fast each sender may send; public for the same reason.
        self.rates = RateLimiter(RateConfig(), clock)
        self._accepting = accepting
        self._on_replicas = on_replicas

    # -- refusing -----------------------------------------------------------------------------

    def note_rejected(self, reason: Reason, detail: str) -> None:
        """Count a refusal (also one the transport made before a message reached us)."""
        self.counters.rejected[str(reason)] += 1
        log.debug("rejected (%s): %s", reason, detail)

    def refuse(self, reason: Reason, detail: str, sender: str = "") -> NoReturn:
        """Count and raise a refusal; one of ``sender``'s bad messages also counts against it."""
        self.note_rejected(reason, detail)
        if sender and (ban_s := self.penalties.note_refusal(sender, reason)):
            log.warning(
                "%s keeps sending bad messages (last: %s); refusing it for %.0f s",
                sender[:8],
                reason,
                ban_s,
            )
        raise Rejected(reason, detail)

    def admit(self, protocol_version: int, sender: str) -> None:
        """The checks every message passes first, whatever it carries. Raises Rejected."""
        why = self._accepting()
        if why is not None:
            self.refuse(why, _NOT_TAKING.get(why, str(why)))
        # A banned sender is refused before anything of its message is looked at.
        ban_left_s = self.penalties.ban_left_s(sender)
        if ban_left_s > 0:
            self.refuse(
                Reason.BANNED,
                f"{sender[:8]} sent too many bad messages; refused for another {ban_left_s:.0f} s",
            )
        if sender and not self.rates.allow(sender):
            self.refuse(Reason.RATE_LIMITED, f"{sender[:8]} sends faster than its rate limit")
        if protocol_version != PROTOCOL_VERSION:
            self.refuse(
                Reason.PROTOCOL_VERSION,
                f"protocol version {protocol_version} is not ours ({PROTOCOL_VERSION})",
                sender,
            )

    def received(self, sender: str, nbytes: int) -> None:
        self.counters.bytes_received += nbytes
        self.counters.received_from[sender] += nbytes

    # -- gossip -------------------------------------------------------------------------------

    def push_delta(self, delta: Delta, nbytes: int) -> Steps[int]:
        """Apply a delta to the sender's replica; returns the replica's new sequence number."""
        self.admit(delta.protocol_version, delta.sender)
        d, state = delta, self.state
        try:
            seq: int = yield lambda: state.receive_delta(
                d.sender, d.session, d.seq, d.payload, d.step, d.degree
            )
        except (GossipError, CodecError) as err:
            self.refuse(reason_of(err), str(err), d.sender)
        self.received(d.sender, nbytes)
        self.counters.histograms.delta_bytes.observe(nbytes)
        return seq

    def open_snapshot(self, header: SnapshotHeader) -> Steps[None]:
        """The checks a snapshot's header must pass before its values are worth receiving."""
        self.admit(header.protocol_version, header.sender)
        h, state = header, self.state
        try:
            yield lambda: state.check_snapshot(h.sender, h.session, h.seq, h.numel)
        except (GossipError, CodecError) as err:
            self.refuse(reason_of(err), str(err), h.sender)

    def apply_snapshot(
        self, header: SnapshotHeader, values: torch.Tensor, nbytes: int
    ) -> Steps[int]:
        """Replace the sender's replica by its public copy (after :meth:`open_snapshot`): the
        ``values`` sent, or for a snapshot named by its digest, the model of that digest this
        node holds (its own public copy or a replica: at start-up every node holds the
        swarm's one starting model), refused as ``unknown_base`` when it holds none."""
        h, state = header, self.state

        def work() -> int:
            taken = values
            if h.digest:
                held = [state.public, *(r.value for r in state.replicas.values())]
                found = find_model(h.digest, held)
                if found is None:  # a miss, not a fault: neither counted nor held against it
                    raise Rejected(
                        Reason.UNKNOWN_BASE, "the snapshot names a model this node does not hold"
                    )
                taken = found
            seq = state.receive_snapshot(h.sender, h.session, h.seq, taken, 0, h.degree)
            self._on_replicas()
            return seq

        try:
            seq: int = yield work
        except (GossipError, CodecError) as err:
            self.refuse(reason_of(err), str(err), h.sender)
        self.received(h.sender, nbytes)
        return seq

    def push_snapshot(
        self, header: SnapshotHeader, values: torch.Tensor, nbytes: int
    ) -> Steps[int]:
        """:meth:`open_snapshot` and :meth:`apply_snapshot` for values already at hand."""
        yield from self.open_snapshot(header)
        return (yield from self.apply_snapshot(header, values, nbytes))
