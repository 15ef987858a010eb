"""Outbound links: the link machine (gossip/link.py) driven over a transport, never blocking.

What to send and when is the machine's call: a snapshot of x̂ when the neighbour is new, reports
a gap, could not be reached, or fell so far behind that the bounded queue overflowed; deltas in
sequence otherwise; back-off after failures. This module only carries its commands: a snapshot
by a call, deltas on a long-lived stream whose acknowledgements a reader task hands back, and
the machine's deadlines as timers. Memory per link is bounded by the machine's queue.

A link is *busy* while ``window`` deltas are unacknowledged or queued. The node makes a new gossip
round only when no healthy link is busy, so the rounds it makes are as fresh as the network can
carry: skipping a round loses nothing, since x - x̂ keeps what was not sent (error feedback), while
queueing rounds would only make every replica staler.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import math
from collections.abc import Awaitable, Callable

import torch

from gossip.link import Link, LinkConfig, LinkStats, SendDelta, SendSnapshot
from gossip.messages import Delta, Member, SnapshotHeader
from gossip.outbox import Outbox
from node.daemon.aio import cancel_and_wait
from node.daemon.pacing import Outflow
from node.runtime import Runtime
from node.telemetry.events import Counters
from node.transport import wire_sizes
from node.transport.base import DeltaStream, Rejected, Transport, Unreachable

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


class PeerLink:
    """Args:
    peer: whom to deliver to.
    snapshot: returns x̂ on the host, with its header; asked whether it may name a snapshot of
        the starting model by its digest (the link's machine says, gossip/link.py).
    runtime: the clock the link's deadlines are read on (the loop's, which arms its timers)
        and the RNG its back-off's jitter is forked from.
    on_change: called whenever the link may have become busy or idle.
    outflow: the node's upload cap and byte budget, shared by its links (None: neither).
    snapshot_nbytes: about what a snapshot of x̂ weighs: with a byte budget, a snapshot waits
        until the budget allows that much (gossip/link.py's ``hold``).
    """

    def __init__(
        self,
        peer: Member,
        transport: Transport,
        snapshot: Callable[[bool], Awaitable[tuple[SnapshotHeader, torch.Tensor]]],
        cfg: LinkConfig,
        counters: Counters,
        runtime: Runtime,
        on_change: Callable[[], None] = lambda: None,
        outflow: Outflow | None = None,
        snapshot_nbytes: int = 0,
    ) -> None:
        self.peer = peer
        self._outflow = outflow
        self.transport = transport
        self.cfg = cfg
        self.counters = counters
        self.runtime = runtime
        budget = outflow.budget if outflow is not None else None
        hold = None
        #: Bytes of the next snapshot that the budget counted when it let the snapshot go.
        self._claimed = 0
        if budget is not None:

            def hold() -> float:
                wait_s = budget.claim(snapshot_nbytes)  # counted now: links ask together
                if wait_s == 0:
                    self._claimed = snapshot_nbytes
                return wait_s

        self.machine = Link(cfg, runtime.fork_rng(), hold)
        self._snapshot = snapshot
        self._on_change = on_change
        self._wake = asyncio.Event()
        self._stream: DeltaStream | None = None
        self._overdue_timer: asyncio.TimerHandle | None = None
        self._reader: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"link-{self.peer.node_id[:8]}")

    async def stop(self) -> None:
        self.machine.close()
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
    def outbox(self) -> Outbox:
        return self.machine.outbox

    @property
    def stats(self) -> LinkStats:
        return self.machine.stats

    @property
    def healthy(self) -> bool:
        """Streaming deltas (not resyncing or backing off after a failure)."""
        return self.machine.healthy

    def progress(self) -> str:
        """Where the link stands, in words (see ``Link.progress``)."""
        return self.machine.progress(self._now())

    @property
    def busy(self) -> bool:
        """Whether another round now would only wait in line (see ``Link.busy``)."""
        return self.machine.busy(self._now())

    def offer(self, delta: Delta) -> None:
        """Queue a delta; never blocks. A full queue is dropped in favour of a resync."""
        self.machine.offer(delta)
        self._wake.set()
        self._on_change()

    # -- carrying the machine's commands ------------------------------------------------------

    def _now(self) -> float:
        return self.runtime.clock.now()

    def _changed(self) -> None:
        """Wake the node now, and again when the oldest answer becomes overdue: the link then
        stops being busy without anything else happening."""
        if self._overdue_timer is not None:
            self._overdue_timer.cancel()
            self._overdue_timer = None
        at = self.machine.overdue_at()
        if at is not None:
            self._overdue_timer = asyncio.get_running_loop().call_at(at + 1e-3, self._on_change)
        self._on_change()

    def _refused(self, epoch: int, err: Rejected) -> None:
        treat = self.machine.refused(epoch, err.reason, self._now())
        if treat is not None and not treat.resync:
            level = logging.DEBUG if treat.expected else logging.WARNING
            log.log(level, "%s refused our message: %s", self.peer.node_id[:8], err)

    def _failed(self, epoch: int, err: Exception) -> None:
        if self.machine.failed(epoch, self._now()):
            log.debug("%s unreachable: %s", self.peer.node_id[:8], err)

    async def _drop_stream(self) -> None:
        reader, self._reader = self._reader, None
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.cancel()
        if reader is not None:
            await cancel_and_wait(reader)

    async def _read_acks(self, stream: DeltaStream, epoch: int) -> None:
        try:
            while True:
                await stream.next_ack()
                self.machine.acked(epoch, self._now())
                self._changed()
        except Rejected as err:
            self._refused(epoch, err)
        except Unreachable as err:
            self._failed(epoch, err)
        self._wake.set()  # the sending loop resyncs
        self._changed()

    async def _send_snapshot(self, epoch: int) -> None:
        # The old stream goes first: a snapshot must not overtake deltas it already covers.
        await self._drop_stream()
        header, values = await self._snapshot(self.machine.may_name)
        self.machine.snapshot_taken(epoch, header.seq, self._now())
        self._changed()
        nbytes = wire_sizes.snapshot_nbytes(header)
        claimed, self._claimed = self._claimed, 0
        if self._outflow is not None:
            await self._outflow.take(nbytes, claimed)
        timeout_s = transfer_timeout_s(self.cfg.call_timeout_s, nbytes)
        await self.transport.call_push_snapshot(self.peer.address, header, values, timeout_s)
        self.machine.snapshot_answered(epoch, self._now(), bool(header.digest))
        self.stats.bytes_sent += nbytes
        self.counters.bytes_sent += nbytes
        self.counters.bytes_sent_fp32 += nbytes
        self.counters.snapshots_sent += 1
        self.counters.snapshot_bytes_sent += nbytes
        if self.machine.healthy:  # else the queue overflowed meanwhile: a fresher one goes
            self._stream = await self.transport.open_delta_stream(self.peer.address)
            self._reader = asyncio.create_task(self._read_acks(self._stream, epoch))

    async def _send_delta(self, command: SendDelta) -> None:
        assert self._stream is not None
        delta = command.delta
        nbytes = wire_sizes.delta_nbytes(delta)
        if self._outflow is not None:
            await self._outflow.take(nbytes)
        await self._stream.send(delta)
        self.stats.bytes_sent += nbytes
        self.counters.bytes_sent += nbytes
        self.counters.bytes_sent_fp32 += wire_sizes.delta_fp32_nbytes(delta)

    async def _wait(self, deadline: float) -> None:
        """Until something happens to the link, or ``deadline`` (a back-off's end)."""
        if math.isinf(deadline):
            await self._wake.wait()
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                await self._wake.wait()

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            command = self.machine.poll(self._now())
            if command is None:
                await self._wait(self.machine.next_deadline())
                continue
            try:
                if isinstance(command, SendSnapshot):
                    await self._send_snapshot(command.epoch)
                else:
                    await self._send_delta(command)
            except Rejected as err:
                self._refused(command.epoch, err)
                await self._drop_stream()
            except Exception as err:  # Unreachable, or a bug: a link must never die quietly
                if not isinstance(err, Unreachable):
                    log.exception("link to %s failed", self.peer.node_id[:8])
                self._failed(command.epoch, err)
                await self._drop_stream()
            finally:
                self._changed()
