"""The node's inbound side: every message is checked before it touches state.

A refused message raises :class:`Rejected` with a reason, is counted under that reason, and leaves
the node exactly as it was: the state machine checks everything before it changes anything, and
snapshots are assembled in a buffer of their own before they replace a replica.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, NoReturn

import torch

from gossip.codecs import CodecError, NonFiniteError, tensor_from_bytes
from gossip.messages import PROTOCOL_VERSION, Delta, Hello, ModelChunk, SnapshotHeader
from gossip.replicas import (
    GossipError,
    ImplausibleUpdate,
    SequenceGap,
    StaleSequence,
    UnknownPeer,
)
from gossip.swim import SwimMessage
from node import wire
from node.penalties import Penalties, PenaltyConfig, RateConfig, RateLimiter, SystemClock
from node.status import NodeStatus
from node.transport.base import Reason, Rejected, SnapshotChunk, iter_chunks

if TYPE_CHECKING:
    from node.node import Node

__all__ = ["NodeService"]

log = logging.getLogger(__name__)


def reason_of(err: Exception) -> Reason:
    """The refusal a core error stands for (the simulator refuses with the same)."""
    if isinstance(err, UnknownPeer):
        return Reason.UNKNOWN_SENDER
    if isinstance(err, SequenceGap):
        return Reason.GAP
    if isinstance(err, StaleSequence):
        return Reason.STALE
    if isinstance(err, NonFiniteError):
        return Reason.NON_FINITE
    if isinstance(err, ImplausibleUpdate):
        return Reason.IMPLAUSIBLE
    return Reason.BAD_PAYLOAD


class NodeService:
    """Implements the transport's ``Handler`` for one node."""

    def __init__(
        self, node: Node, penalties: Penalties | None = None, rates: RateLimiter | None = None
    ) -> None:
        self.node = node
        #: Who is kept out for sending bad messages; public so that tests can give it a clock.
        self.penalties = penalties or Penalties(PenaltyConfig(), SystemClock())
        #: How fast each sender may send; public for the same reason.
        self.rates = rates or RateLimiter(RateConfig(), SystemClock())

    def is_revoked(self, node_id: str) -> bool:
        return node_id in self.node.peers.revocations.node_ids

    def note_rejected(self, reason: Reason, detail: str) -> None:
        self.node.counters.rejected[str(reason)] += 1
        log.debug("rejected (%s): %s", reason, detail)

    def _refuse(self, reason: Reason, detail: str, sender: str = "") -> NoReturn:
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

    def _check_common(self, protocol_version: int, sender: str) -> None:
        if self.node.closing:
            self._refuse(Reason.SHUTTING_DOWN, "this node is shutting down")
        if not self.node.ready:
            self._refuse(Reason.NOT_READY, "this node is still starting")
        # A banned sender is refused before anything of its message is looked at.
        ban_left_s = self.penalties.ban_left_s(sender)
        if ban_left_s > 0:
            self._refuse(
                Reason.BANNED,
                f"{sender[:8]} sent too many bad messages; refused for another {ban_left_s:.0f} s",
            )
        if sender and not self.rates.allow(sender):
            self._refuse(Reason.RATE_LIMITED, f"{sender[:8]} sends faster than its rate limit")
        if protocol_version != PROTOCOL_VERSION:
            self._refuse(
                Reason.PROTOCOL_VERSION,
                f"protocol version {protocol_version} is not ours ({PROTOCOL_VERSION})",
                sender,
            )

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
        self._check_common(delta.protocol_version, delta.sender)
        try:
            seq = await self.node.gossiper.receive_delta(delta)
        except (GossipError, CodecError) as err:
            self._refuse(reason_of(err), str(err), delta.sender)
        nbytes = wire.delta_nbytes(delta)
        self.node.counters.bytes_received += nbytes
        self.node.counters.received_from[delta.sender] += nbytes
        self.node.notify_change()
        return seq

    async def rpc_push_snapshot(
        self, header: SnapshotHeader, chunks: AsyncIterator[SnapshotChunk]
    ) -> int:
        sender = header.sender
        self._check_common(header.protocol_version, sender)
        try:
            await self.node.gossiper.check_snapshot(header)
        except (GossipError, CodecError) as err:
            self._refuse(reason_of(err), str(err), sender)
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
        try:
            seq = await self.node.gossiper.receive_snapshot(header, values)
        except (GossipError, CodecError) as err:
            self._refuse(reason_of(err), str(err), sender)
        nbytes = wire.snapshot_nbytes(header)
        self.node.counters.bytes_received += nbytes
        self.node.counters.received_from[header.sender] += nbytes
        self.node.notify_change()
        return seq

    async def rpc_status(self) -> NodeStatus:
        return await self.node.status()
