"""Outbound links: this node's deltas delivered to one neighbour, in order, never blocking.

The receiver's replica is a replicated log of this node's public copy x̂. What to send is decided
by the link's :class:`~gossip.outbox.Outbox` (deltas in sequence while all goes well, a snapshot of
x̂ when the neighbour is new, reports a gap, could not be reached, or fell so far behind that the
bounded queue overflowed); this module carries those decisions over a transport: deltas on a
long-lived stream, snapshots by a call. Memory per link is bounded by the queue.

A link is *busy* while ``window`` deltas are unacknowledged or queued. The node makes a new gossip
round only when no healthy link is busy, so the rounds it makes are as fresh as the network can
carry: skipping a round loses nothing, since x - x̂ keeps what was not sent (error feedback), while
queueing rounds would only make every replica staler.
"""

from __future__ import annotations

import asyncio
import io
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import torch

from gossip.messages import Delta, Member, SnapshotHeader
from gossip.outbox import Outbox, OutboxConfig
from node import wire
from node.aio import cancel_and_wait
from node.telemetry import Counters, LinkCounters
from node.transport.base import DeltaStream, Reason, Rejected, Transport, Unreachable

__all__ = ["MIN_LINK_BYTES_PER_S", "LinkConfig", "PeerLink", "transfer_timeout_s"]

#: A link that has not stopped this long after its cancellation is reported (with its stack).
STOP_WARN_S = 5.0

#: The slowest link a whole-model transfer is given time for: 1 Mbit/s, an edge uplink.
MIN_LINK_BYTES_PER_S = 125_000


def transfer_timeout_s(call_timeout_s: float, nbytes: int) -> float:
    """The deadline of a call that carries ``nbytes`` (a snapshot, a model pull): the usual
    deadline plus what those bytes take on the slowest link allowed for."""
    return call_timeout_s + nbytes / MIN_LINK_BYTES_PER_S


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LinkConfig:
    """Args:
    queue: deltas held for a neighbour; past that the link resyncs with a snapshot instead.
    window: unacknowledged deltas after which the link counts as busy.
    """

    queue: int = 16
    window: int = 2
    call_timeout_s: float = 10.0
    backoff_min_s: float = 0.1
    backoff_max_s: float = 5.0
    #: Retry delay while the peer does not count us as a neighbour yet: its member view lags
    #: ours by a protocol period or so, so waiting longer would only waste the edge.
    not_neighbour_retry_s: float = 0.25


class PeerLink:
    """Args:
    peer: whom to deliver to.
    snapshot: returns x̂ on the host, with its header.
    on_change: called whenever the link may have become busy or idle.
    """

    def __init__(
        self,
        peer: Member,
        transport: Transport,
        snapshot: Callable[[], Awaitable[tuple[SnapshotHeader, torch.Tensor]]],
        cfg: LinkConfig,
        counters: Counters,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.peer = peer
        self.transport = transport
        self.cfg = cfg
        self.counters = counters
        self.stats = LinkCounters()
        self._snapshot = snapshot
        self._on_change = on_change
        self.outbox = Outbox(OutboxConfig(cfg.queue, cfg.window))
        self._wake = asyncio.Event()
        self._error: Exception | None = None
        self._stream: DeltaStream | None = None
        self._sending_snapshot = False
        self._overdue_timer: asyncio.TimerHandle | None = None
        self._reader: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"link-{self.peer.node_id[:8]}")

    async def stop(self) -> None:
        if self._overdue_timer is not None:
            self._overdue_timer.cancel()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # A link must let go at once; if one does not, say where it is stuck.
            done, _ = await asyncio.wait({task}, timeout=STOP_WARN_S)
            if not done:
                where = io.StringIO()
                task.print_stack(file=where)
                log.error(
                    "link to %s ignores its cancellation:\n%s",
                    self.peer.node_id[:8],
                    where.getvalue(),
                )
            await cancel_and_wait(task)
        await self._drop_stream()

    # -- state --------------------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """Streaming deltas (not resyncing or backing off after a failure)."""
        return self._stream is not None and not self.outbox.needs_snapshot

    @property
    def busy(self) -> bool:
        """A link that cannot take another round without it waiting in line: streaming with
        ``window`` deltas unacknowledged or queued, or sending a snapshot with ``window`` queued
        behind it. A link backing off after a failure is never busy, so a dead neighbour does
        not hold up the others' rounds, nor is one whose answer is overdue (a neighbour that
        vanished without a word), so it holds them up for a few answer times at most."""
        return (self.healthy or self._sending_snapshot) and self.outbox.busy_at(self._now())

    def offer(self, delta: Delta) -> None:
        """Queue a delta; never blocks. A full queue is dropped in favour of a resync."""
        self.outbox.offer(delta)
        self._wake.set()
        self._on_change()

    # -- sending ------------------------------------------------------------------------------

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def _arm_overdue_timer(self) -> None:
        """Wake the node when the oldest answer becomes overdue: the link then stops being busy
        without anything else happening."""
        if self._overdue_timer is not None:
            self._overdue_timer.cancel()
            self._overdue_timer = None
        at = self.outbox.overdue_at()
        if at is not None:
            self._overdue_timer = asyncio.get_running_loop().call_at(at + 1e-3, self._on_change)

    def _changed(self) -> None:
        self._arm_overdue_timer()
        self._on_change()

    async def _drop_stream(self) -> None:
        reader, self._reader = self._reader, None
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.cancel()
        if reader is not None:
            await cancel_and_wait(reader)

    async def _read_acks(self, stream: DeltaStream) -> None:
        try:
            while True:
                await stream.next_ack()
                self.outbox.acked(self._now())
                self._changed()
        except (Rejected, Unreachable) as err:
            self._error = err  # handled by the sending loop, which this wakes
            self._wake.set()

    async def _send_snapshot(self) -> None:
        # The old stream goes first: a snapshot must not overtake deltas it already covers.
        await self._drop_stream()
        header, values = await self._snapshot()
        self.outbox.snapshot_taken(header.seq, self._now())
        self._sending_snapshot = True
        self._changed()
        try:
            timeout_s = transfer_timeout_s(self.cfg.call_timeout_s, wire.snapshot_nbytes(header))
            await self.transport.call_push_snapshot(self.peer.address, header, values, timeout_s)
        finally:
            self._sending_snapshot = False
        self.outbox.snapshot_answered(self._now())
        nbytes = wire.snapshot_nbytes(header)
        self.stats.snapshots_sent += 1
        self.stats.bytes_sent += nbytes
        self.counters.bytes_sent += nbytes
        self.counters.bytes_sent_fp32 += nbytes
        if self.outbox.needs_snapshot:
            return  # the queue overflowed meanwhile: the loop sends a fresher one
        self._stream = await self.transport.open_delta_stream(self.peer.address)
        self._reader = asyncio.create_task(self._read_acks(self._stream))
        self._on_change()

    async def _send_delta(self, delta: Delta) -> None:
        assert self._stream is not None
        await self._stream.send(delta)
        self.outbox.delta_sent(delta, self._now())
        self._arm_overdue_timer()
        nbytes = wire.delta_nbytes(delta)
        self.stats.deltas_sent += 1
        self.stats.bytes_sent += nbytes
        self.counters.bytes_sent += nbytes
        self.counters.bytes_sent_fp32 += wire.delta_fp32_nbytes(delta)

    async def _next_delta(self) -> Delta | None:
        """The next queued delta not covered by the last snapshot; None on a stream error."""
        while True:
            if self._error is not None:
                return None
            delta = self.outbox.next_delta()
            if delta is not None:
                return delta
            self._wake.clear()
            await self._wake.wait()

    async def _run(self) -> None:
        backoff = self.cfg.backoff_min_s
        while True:
            try:
                if self.outbox.needs_snapshot:
                    await self._send_snapshot()
                    continue
                delta = await self._next_delta()
                if delta is None:
                    err, self._error = self._error, None
                    assert err is not None
                    raise err
                await self._send_delta(delta)
                backoff = self.cfg.backoff_min_s
                continue
            except Rejected as err:
                await self._drop_stream()
                self.outbox.refused()
                if err.reason in (Reason.GAP, Reason.STALE):
                    continue  # the snapshot repairs it
                self.stats.failures += 1
                if err.reason is Reason.UNKNOWN_SENDER:
                    # Its view does not make us neighbours yet; membership gossip will.
                    log.debug("%s does not count us as a neighbour yet", self.peer.node_id[:8])
                    backoff = self.cfg.not_neighbour_retry_s
                elif err.reason in (Reason.NOT_READY, Reason.SHUTTING_DOWN):
                    log.debug("%s is not taking messages: %s", self.peer.node_id[:8], err)
                else:
                    log.warning("%s refused our message: %s", self.peer.node_id[:8], err)
            except Exception as err:  # Unreachable, or a bug: a link must never die quietly
                if not isinstance(err, Unreachable):
                    log.exception("link to %s failed", self.peer.node_id[:8])
                await self._drop_stream()
                self.stats.failures += 1
                self.outbox.lost()
                log.debug("%s unreachable: %s", self.peer.node_id[:8], err)
            finally:
                self._changed()
            # Back off with jitter before trying again, so a dead peer costs little.
            await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
            backoff = min(2 * backoff, self.cfg.backoff_max_s)
