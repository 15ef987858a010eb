"""A simulated outbound link: the daemon's link machine (gossip/link.py) over the modelled network.

The counterpart of node/daemon/links.py's ``PeerLink``: both are drivers of one :class:`Link`
machine, which decides what to send when (snapshot, deltas, resync, back-off), so only the carrying
differs. A snapshot goes by a call whose answer lets the epoch's stream carry deltas; each delta
is acknowledged once the receiver applied it through its inbound path (node/daemon/inbound.py), as
the daemon's service does.

Modelling choices: a lost delta is a broken stream, which the sender notices a round trip
later and the receiver as a gap in what still arrives on it; the machine then resyncs by
snapshot after its back-off, as on any failure. Snapshot calls and acknowledgements are not lost
(the transport retries them). A call to a node that is gone fails after its deadline (the
daemon's ``transfer_timeout_s``); deltas streamed to it vanish without an answer, so the link
stays busy with them until their answer is overdue (as the machine judges it, from the link's
usual answer time), then no longer holds up the node's rounds, as in the daemon.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Protocol

import torch

from gossip.budget import ByteBudget
from gossip.digest import model_digest
from gossip.link import Link, LinkConfig, LinkStats, SendDelta
from gossip.messages import Delta, Member, SnapshotHeader
from gossip.outbox import Outbox
from gossip.replicas import GossipState
from gossip.upload_cap import UploadCap
from node.daemon.links import transfer_timeout_s
from node.sim.world import World
from node.telemetry.events import Counters
from node.transport.base import Rejected

__all__ = ["REPLY_BYTES", "LinkOwner", "SimLink"]

#: Bytes an acknowledgement or a refusal takes on the receiver's uplink (a few varints).
REPLY_BYTES = 8


class LinkOwner(Protocol):
    """The simulated node a link sends for (node/sim/node.py ``SimNode``)."""

    @property
    def sim(self) -> World: ...

    @property
    def node_id(self) -> str: ...

    @property
    def address(self) -> str: ...

    @property
    def state(self) -> GossipState: ...

    @property
    def degree(self) -> int: ...

    @property
    def model(self) -> torch.Tensor:
        """x, flat (a link's copy, with one per link, starts afresh from it)."""
        ...

    @property
    def counters(self) -> Counters: ...

    @property
    def budget(self) -> ByteBudget | None:
        """What the link's sends spend (None: no budget)."""
        ...

    @property
    def start_digest(self) -> bytes:
        """The digest of the model the node started from."""
        ...

    @property
    def upload_cap(self) -> UploadCap | None:
        """What the link's models wait for (None: no cap)."""
        ...

    def delta_nbytes(self, delta: Delta) -> tuple[int, int]: ...

    def snapshot_nbytes(self, header: SnapshotHeader) -> int: ...

    def check_ready(self) -> None:
        """A link came up: the node may start training."""
        ...


class SimLink:
    """Args:
    owner: the node that sends.
    peer: whom to deliver to.
    """

    def __init__(self, owner: LinkOwner, peer: Member, cfg: LinkConfig) -> None:
        self.owner = owner
        self.peer = peer
        self.cfg = cfg
        budget, nbytes = owner.budget, 4 * owner.state.numel
        hold = None
        if budget is not None:  # a snapshot waits for the budget, as the daemon's does

            def hold() -> float:
                return budget.claim(nbytes)  # counted at once, as the daemon's is

        self.machine = Link(cfg, owner.sim.rng, hold)
        self.stats: LinkStats = self.machine.stats
        self._wake_at = math.inf  # when a pump is already scheduled
        # Looked up once: a link carries thousands of deltas.
        self._sim = owner.sim
        self._events = owner.sim.events
        self._network = owner.sim.network

    @property
    def outbox(self) -> Outbox:
        return self.machine.outbox

    @property
    def healthy(self) -> bool:
        return self.machine.healthy

    @property
    def busy(self) -> bool:
        return self.machine.busy(self._events.now())

    def close(self) -> None:
        self.machine.close()

    def offer(self, delta: Delta) -> None:
        self.machine.offer(delta)
        self.pump()

    def pump(self) -> None:
        """Carry out what the machine says, and come back when its back-off ends."""
        now = self._events.now()
        machine = self.machine
        while (command := machine.poll(now)) is not None:
            if isinstance(command, SendDelta):
                self._send_delta(command)
            else:
                self._send_snapshot(command.epoch)
        deadline = machine.next_deadline()
        if deadline < self._wake_at:
            self._wake_at = deadline
            self._events.at(deadline, self._woken)

    def _woken(self) -> None:
        self._wake_at = math.inf
        self.pump()

    # -- carrying -----------------------------------------------------------------------------

    def _send_snapshot(self, epoch: int) -> None:
        owner, sim = self.owner, self.owner.sim
        seq, values = owner.state.snapshot_for(self.peer.node_id, owner.model)
        named = b""  # the starting model goes by name, as the daemon's (gossip/digest.py)
        start = owner.start_digest
        if self.machine.may_name and start and (digest := model_digest(values)) == start:
            named = digest
        header = SnapshotHeader(
            owner.node_id, owner.state.session, seq, values.numel(), owner.degree, digest=named
        )
        sent_at = sim.events.now()
        self.machine.snapshot_taken(epoch, seq, sent_at)
        nbytes = owner.snapshot_nbytes(header)
        if named and owner.budget is not None:  # it claimed a whole model: the rest goes back
            owner.budget.spend(nbytes - 4 * owner.state.numel)
        timeout_s = transfer_timeout_s(self.cfg.call_timeout_s, nbytes)

        def arrive() -> None:
            target = sim.live_node(self.peer.address)
            if target is None:
                sim.events.at(sent_at + timeout_s, lambda: self._failed(epoch))
                return
            try:
                result: int | Rejected = target.rpc_push_snapshot(header, values, nbytes)
            except Rejected as err:
                result = err
            sim.network.send(
                target.address,
                owner.address,
                REPLY_BYTES,
                lambda: self._snapshot_answered(epoch, nbytes, result, bool(header.digest)),
                lossy=False,
            )

        def send() -> None:
            sim.network.send(owner.address, self.peer.address, nbytes, arrive, lossy=False)

        self._after_cap(nbytes, send)

    def _after_cap(self, nbytes: int, send: Callable[[], None]) -> None:
        """``send`` now, or when the owner's upload cap lets ``nbytes`` go, as the daemon's
        links wait for it."""
        cap = self.owner.upload_cap
        if cap is None:
            send()
            return
        now = self._events.now()
        at = cap.reserve(nbytes, now)
        if at > now:
            self._events.at(at, send)
        else:
            send()

    def _snapshot_answered(
        self, epoch: int, nbytes: int, result: int | Rejected, named: bool
    ) -> None:
        if isinstance(result, Rejected):
            self._refused(epoch, result)
            return
        if epoch == self.machine.epoch and not self.machine.closed:
            # Counted once the call succeeded, as the daemon counts it.
            self.stats.bytes_sent += nbytes
            self.owner.counters.bytes_sent += nbytes
            self.owner.counters.bytes_sent_fp32 += nbytes
            self.owner.counters.snapshots_sent += 1
            self.owner.counters.snapshot_bytes_sent += nbytes
        self.machine.snapshot_answered(epoch, self.owner.sim.events.now(), named)
        self.pump()
        self.owner.check_ready()

    def _send_delta(self, command: SendDelta) -> None:
        owner, sim, network = self.owner, self._sim, self._network
        delta, epoch = command.delta, command.epoch
        nbytes, fp32_nbytes = owner.delta_nbytes(delta)
        src, dst = owner.address, self.peer.address
        stream = (owner.node_id, epoch)

        def arrive() -> None:
            target = sim.live_node(dst)
            if target is None:
                return  # vanished: no answer ever comes
            try:
                result: int | Rejected = target.rpc_push_delta(delta, stream, nbytes)
            except Rejected as err:
                result = err
            network.send(dst, src, REPLY_BYTES, partial(self._delta_answered, epoch, result), False)

        def send() -> None:
            if epoch != self.machine.epoch or self.machine.closed:
                return  # the stream it waited to go on is gone, as the daemon's would be
            self.stats.bytes_sent += nbytes
            counters = owner.counters
            counters.bytes_sent += nbytes
            counters.bytes_sent_fp32 += fp32_nbytes
            if owner.budget is not None:
                owner.budget.spend(nbytes)  # as the daemon's Outflow counts it
            if not network.send(src, dst, nbytes, arrive):
                # Lost: on a stream that is a broken connection, which the sender notices about
                # a round trip later (a reset), as the in-memory transport's dropped send and
                # gRPC's broken stream both surface as Unreachable. Deltas sent meanwhile arrive
                # after a gap and are refused, unread; the resync's snapshot covers them all.
                self._events.after(2 * network.latency(src, dst), partial(self._failed, epoch))

        self._after_cap(nbytes, send)

    def _delta_answered(self, epoch: int, result: int | Rejected) -> None:
        if isinstance(result, Rejected):
            self._refused(epoch, result)
        else:
            self.machine.acked(epoch, self._events.now())

    def _refused(self, epoch: int, err: Rejected) -> None:
        if self.machine.refused(epoch, err.reason, self.owner.sim.events.now()) is not None:
            self.pump()

    def _failed(self, epoch: int) -> None:
        if self.machine.failed(epoch, self.owner.sim.events.now()):
            self.pump()
