"""A simulated outbound link: the daemon's link policy (gossip/outbox.py) over the modelled network.

The counterpart of node/links.py's ``PeerLink``, step for step: a snapshot of x̂ by a call whose
answer opens the delta stream (the old stream goes first); deltas on the stream, each
acknowledged; a refusal kills the stream, and a gap or a stale message resyncs at once while
other refusals and failures back off (doubling, with jitter) before the next snapshot; a
neighbour that does not count us yet is retried soon. What to send when is the Outbox's call,
as in the daemon; only the carrying differs.

Modelling choices: a lost delta is a broken stream, which the sender notices a round trip
later and the receiver as a gap in what still arrives on it; the link then resyncs by snapshot
after its backoff, as on any failure. Snapshot calls and acknowledgements are not lost (the
transport retries them). A call to a node that is gone fails after its deadline (the daemon's
``transfer_timeout_s``); deltas streamed to it vanish without an answer, so the link stays busy
with them until their answer is overdue (as the Outbox judges it, from the link's usual answer
time), then no longer holds up the node's rounds, as in the daemon.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from gossip.messages import Delta, Member, SnapshotHeader
from gossip.outbox import Outbox, OutboxConfig
from node.links import LinkConfig, transfer_timeout_s
from node.telemetry import LinkCounters
from node.transport.base import Reason, Rejected, Unreachable

if TYPE_CHECKING:
    from node.sim.node import SimNode

__all__ = ["SimLink"]

#: Bytes an acknowledgement or a refusal takes on the receiver's uplink (a few varints).
REPLY_BYTES = 8


class SimLink:
    """Args:
    owner: the node that sends.
    peer: whom to deliver to.
    """

    def __init__(self, owner: SimNode, peer: Member, cfg: LinkConfig) -> None:
        self.owner = owner
        self.peer = peer
        self.cfg = cfg
        self.outbox = Outbox(OutboxConfig(cfg.queue, cfg.window))
        self.stats = LinkCounters()
        self.stream = 0  # the open stream's number; 0: none
        self._streams = 0
        self.calling = False
        self.closed = False
        self._backoff = cfg.backoff_min_s
        self._resume_at = -math.inf

    @property
    def healthy(self) -> bool:
        return self.stream != 0 and not self.outbox.needs_snapshot

    @property
    def busy(self) -> bool:
        """As PeerLink.busy: streaming, or sending a snapshot, with ``window`` in line and no
        answer overdue."""
        return (self.healthy or self.calling) and self.outbox.busy_at(self.owner.sim.events.now())

    def close(self) -> None:
        self.closed = True
        self.stream = 0

    def offer(self, delta: Delta) -> None:
        self.outbox.offer(delta)
        self.pump()

    def pump(self) -> None:
        """Send what the outbox says, unless a call is out or the link backs off."""
        sim = self.owner.sim
        if self.closed or self.calling or sim.events.now() < self._resume_at:
            return
        if self.outbox.needs_snapshot:
            self._send_snapshot()
            return
        while self.stream and (delta := self.outbox.next_delta()) is not None:
            self._send_delta(delta)

    # -- sending ------------------------------------------------------------------------------

    def _send_snapshot(self) -> None:
        # The old stream goes first: a snapshot must not overtake deltas it already covers.
        self.stream = 0
        owner, sim = self.owner, self.owner.sim
        seq, values = owner.state.snapshot()
        header = SnapshotHeader(
            owner.node_id, owner.state.session, seq, values.numel(), owner.degree
        )
        self.outbox.snapshot_taken(seq, sim.events.now())
        self.calling = True
        sent_at = sim.events.now()
        nbytes = owner.snapshot_nbytes(header)
        timeout_s = transfer_timeout_s(self.cfg.call_timeout_s, nbytes)

        def arrive() -> None:
            target = sim.live_node(self.peer.address)
            if target is None:
                sim.events.at(sent_at + timeout_s, lambda: self._failed_call())
                return
            try:
                result: int | Rejected = target.rpc_push_snapshot(header, values)
            except Rejected as err:
                result = err
            sim.network.send(
                target.address,
                owner.address,
                REPLY_BYTES,
                lambda: self._snapshot_answered(header, result),
                lossy=False,
            )

        sim.network.send(owner.address, self.peer.address, nbytes, arrive, lossy=False)

    def _failed_call(self) -> None:
        if self.closed:
            return
        self.calling = False
        self._failed(Unreachable(f"{self.peer.address} did not answer"))

    def _snapshot_answered(self, header: SnapshotHeader, result: int | Rejected) -> None:
        if self.closed:
            return
        self.calling = False
        if isinstance(result, Rejected):
            self._failed(result)
            return
        self.outbox.snapshot_answered(self.owner.sim.events.now())
        # Counted once the call succeeded, as the daemon counts it.
        nbytes = self.owner.snapshot_nbytes(header)
        self.stats.snapshots_sent += 1
        self.stats.bytes_sent += nbytes
        self.owner.counters.bytes_sent += nbytes
        self.owner.counters.bytes_sent_fp32 += nbytes
        if not self.outbox.needs_snapshot:  # else the queue overflowed meanwhile: a fresher one
            self._streams += 1
            self.stream = self._streams
        self.pump()

    def _send_delta(self, delta: Delta) -> None:
        owner, sim = self.owner, self.owner.sim
        self.outbox.delta_sent(delta, sim.events.now())
        nbytes, fp32_nbytes = owner.delta_nbytes(delta)
        self.stats.deltas_sent += 1
        self.stats.bytes_sent += nbytes
        owner.counters.bytes_sent += nbytes
        owner.counters.bytes_sent_fp32 += fp32_nbytes
        self._backoff = self.cfg.backoff_min_s
        stream = self.stream

        def arrive() -> None:
            target = sim.live_node(self.peer.address)
            if target is None:
                return  # vanished: no answer ever comes
            try:
                result: int | Rejected = target.rpc_push_delta(
                    delta, (owner.node_id, stream), nbytes
                )
            except Rejected as err:
                result = err
            sim.network.send(
                target.address,
                owner.address,
                REPLY_BYTES,
                lambda: self._delta_answered(stream, result),
                lossy=False,
            )

        if not sim.network.send(owner.address, self.peer.address, nbytes, arrive):
            # Lost: on a stream that is a broken connection, which the sender notices about a
            # round trip later (a reset), as the in-memory transport's dropped send and gRPC's
            # broken stream both surface as Unreachable. Deltas sent meanwhile arrive after a
            # gap and are refused, unread; the resync's snapshot covers them all.
            rtt = 2 * sim.network.latency(owner.address, self.peer.address)
            sim.events.after(rtt, lambda: self._stream_broke(stream))

    def _delta_answered(self, stream: int, result: int | Rejected) -> None:
        if self.closed or stream != self.stream:
            return  # an answer on a stream this link has already dropped
        if isinstance(result, Rejected):
            self._failed(result)
            return
        self.outbox.acked(self.owner.sim.events.now())

    # -- failures -----------------------------------------------------------------------------

    def _stream_broke(self, stream: int) -> None:
        if not self.closed and stream == self.stream:
            self._failed(Unreachable("the stream broke: a delta was lost"))

    def _failed(self, err: Rejected | Unreachable) -> None:
        self.stream = 0
        if isinstance(err, Rejected):
            self.outbox.refused()
            if err.reason in (Reason.GAP, Reason.STALE):
                self.pump()  # the snapshot repairs it
                return
            self.stats.failures += 1
            if err.reason is Reason.UNKNOWN_SENDER:
                # Its view does not make us neighbours yet; membership gossip will.
                self._backoff = self.cfg.not_neighbour_retry_s
        else:
            self.stats.failures += 1
            self.outbox.lost()
        sim = self.owner.sim
        delay = self._backoff * sim.rng.uniform(0.5, 1.0)
        self._resume_at = sim.events.now() + delay
        sim.events.after(delay, self.pump)
        self._backoff = min(2 * self._backoff, self.cfg.backoff_max_s)
