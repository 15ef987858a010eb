"""The node's inbound side: every message is checked before it touches state.

A refused message raises :class:`Rejected` with a reason, is counted under that reason, and leaves
the node exactly as it was: the state machine checks everything before it changes anything, and
snapshots are assembled in a buffer of their own before they replace a replica. Deltas and
snapshots take the node's one inbound path (node/daemon/inbound.py), which the simulator runs too.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, NoReturn

import torch

from gossip.codecs import tensor_from_bytes
from gossip.messages import Delta, Hello, ModelChunk, SnapshotHeader
from gossip.refusals import Reason
from gossip.swim import SwimMessage
from node.daemon.inbound import Inbound
from node.daemon.steps import run_on
from node.runtime import SystemClock
from node.security.penalties import Penalties, RateLimiter
from node.telemetry.status import NodeStatus
from node.transport import wire
from node.transport.base import Rejected, SnapshotChunk, iter_chunks

if TYPE_CHECKING:
    from node.daemon.node import Node

__all__ = ["NodeService"]

log = logging.getLogger(__name__)


class NodeService:
    """Implements the transport's ``Handler`` for one node; gossip goes through the node's one
    inbound path (node/daemon/inbound.py), which the simulator shares."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.inbound = Inbound(
            node.state,
            node.counters,
            SystemClock(),
            accepting=self._accepting,
            on_replicas=node.gossiper.published,
        )

    @property
    def penalties(self) -> Penalties:
        """Who is kept out for sending bad messages; settable so that tests can give it a
        clock."""
        return self.inbound.penalties

    @penalties.setter
    def penalties(self, penalties: Penalties) -> None:
        self.inbound.penalties = penalties

    @property
    def rates(self) -> RateLimiter:
        """How fast each sender may send; settable for the same reason."""
        return self.inbound.rates

    @rates.setter
    def rates(self, rates: RateLimiter) -> None:
        self.inbound.rates = rates

    def _accepting(self) -> Reason | None:
        if self.node.closing:
            return Reason.SHUTTING_DOWN
        if not self.node.ready:
            return Reason.NOT_READY
        return None

    def is_revoked(self, node_id: str) -> bool:
        return node_id in self.node.peers.revocations.node_ids

    def note_rejected(self, reason: Reason, detail: str) -> None:
        self.inbound.note_rejected(reason, detail)

    def _refuse(self, reason: Reason, detail: str, sender: str = "") -> NoReturn:
        self.inbound.refuse(reason, detail, sender)

    def _check_common(self, protocol_version: int, sender: str) -> None:
        self.inbound.admit(protocol_version, sender)

    async def rpc_hello(self, hello: Hello) -> Hello:
        sender = hello.self_.node_id
        self._check_common(hello.protocol_version, sender)
        differences = self.node.fingerprint.differences(hello.fingerprint, "we have", "you have")
        if differences:
            self._refuse(
                Reason.FINGERPRINT,
                "the task differs from this swarm's: " + "; ".join(differences),
                sender,
            )
        if sender == self.node.node_id:
            self._refuse(Reason.MALFORMED, "the caller claims this node's own id")
        try:
            return await self.node.peers.welcome(hello)
        except Rejected as err:
            self._refuse(err.reason, err.detail, sender)

    async def rpc_swim(self, protocol_version: int, message: SwimMessage) -> str:
        self._check_common(protocol_version, message.sender)
        if message.sender == self.node.node_id:
            self._refuse(Reason.MALFORMED, "the sender claims this node's own id")
        if message.revocations:
            self.node.peers.adopt_revocations(message.revocations, message.sender)
        self.node.peers.membership.receive(message)
        return self.node.node_id

    async def rpc_pull_model(
        self, protocol_version: int, requester: str
    ) -> AsyncIterator[ModelChunk]:
        self._check_common(protocol_version, "")
        # One copy of the model, cut into chunks as the stream drains: memory stays bounded.
        values = await self.node.gossiper.model_copy()
        step = self.node.trainer.step
        log.info("sending our model to %s (%d values)", requester[:8], values.numel())
        for chunk in iter_chunks(values):
            yield ModelChunk(values.numel(), chunk.offset, chunk.data, step)

    async def rpc_push_delta(self, delta: Delta) -> int:
        seq = await run_on(
            self.inbound.push_delta(delta, wire.delta_nbytes(delta)), self.node.gossiper.run
        )
        self.node.notify_change()
        return seq

    async def rpc_push_snapshot(
        self, header: SnapshotHeader, chunks: AsyncIterator[SnapshotChunk]
    ) -> int:
        sender = header.sender
        await run_on(self.inbound.open_snapshot(header), self.node.gossiper.run)
        # One model-sized buffer plus one chunk in flight: memory stays bounded.
        values = torch.empty(header.numel, dtype=torch.float32)
        filled = 0
        async for chunk in chunks:
            n, rest = divmod(len(chunk.data), 4)
            if chunk.offset != filled or rest or filled + n > header.numel:
                self._refuse(
                    Reason.MALFORMED,
                    f"snapshot chunk at {chunk.offset} with {len(chunk.data)} bytes does not "
                    f"follow the {filled} values received of {header.numel}",
                    sender,
                )
            values[filled : filled + n] = tensor_from_bytes(chunk.data, torch.float32)
            filled += n
        if filled != header.numel:
            self._refuse(
                Reason.MALFORMED, f"snapshot ended after {filled} of {header.numel} values", sender
            )
        seq = await run_on(
            self.inbound.apply_snapshot(header, values, wire.snapshot_nbytes(header)),
            self.node.gossiper.run,
        )
        self.node.notify_change()
        return seq

    async def rpc_status(self) -> NodeStatus:
        return await self.node.status()
