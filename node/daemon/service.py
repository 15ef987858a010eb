"""The node's inbound side: every message is checked before it touches state.

A refused message raises :class:`Rejected` with a reason, is counted under that reason, and leaves
the node exactly as it was: the state machine checks everything before it changes anything, and
snapshots are assembled in a buffer of their own before they replace a replica. Deltas and
snapshots take the node's one inbound path (node/daemon/inbound.py), which the simulator runs too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, NoReturn, Protocol, TypeVar

import torch

from gossip.codecs import tensor_from_bytes
from gossip.digest import model_digest
from gossip.messages import Delta, Hello, ModelChunk, SnapshotHeader, TaskFingerprint
from gossip.refusals import Reason
from gossip.swim import SwimMessage
from node.daemon.inbound import Inbound
from node.daemon.steps import Steps
from node.security.penalties import Penalties, RateLimiter
from node.telemetry.status import NodeStatus
from node.transport import wire_sizes
from node.transport.base import ControlCaller, Rejected, SnapshotChunk, iter_chunks

__all__ = ["NodeService", "ServicePort"]

log = logging.getLogger(__name__)

#: The values of a snapshot named by its digest: none travel.
_NONE = torch.empty(0)

T = TypeVar("T")


class ServicePort(Protocol):
    """What the service needs of its node, and nothing else."""

    @property
    def node_id(self) -> str: ...

    @property
    def fingerprint(self) -> TaskFingerprint:
        """The task and codec a caller's hello must match."""
        ...

    def is_revoked(self, node_id: str) -> bool: ...

    async def welcome(self, hello: Hello) -> Hello:
        """Take a member in (node/daemon/introductions.py); raises :class:`Rejected`."""
        ...

    def adopt_revocations(self, blob: bytes, source: str) -> Any: ...

    def receive_swim(self, message: SwimMessage) -> None: ...

    async def model_copy(self) -> tuple[torch.Tensor, int]:
        """A copy of the model to serve, and the step it is at."""
        ...

    async def pace_upload(self, nbytes: int, claimed: int = 0) -> None:
        """Wait until ``nbytes`` more of model may go under the upload cap (at once without),
        and count them in the byte budget, but for the ``claimed`` that :meth:`claim_upload`
        counted already."""
        ...

    def claim_upload(self, nbytes: int) -> float:
        """Seconds until ``nbytes`` more of model fit the byte budget (0: now, or no budget);
        when 0 they are counted spent at once."""
        ...

    @property
    def upload_chunk_values(self) -> int:
        """Values per chunk of a model served: under an upload cap, no more than it lets go at
        once, so that the chunks go out paced rather than in one burst."""
        ...

    async def on_worker(self, steps: Steps[T]) -> T:
        """Run an inbound path's steps where the gossip state lives."""
        ...

    def changed(self) -> None:
        """The state changed (a delta or snapshot applied): wake whoever waits on it."""
        ...

    async def status(self) -> NodeStatus: ...

    async def control(self, action: str) -> tuple[bool, str]:
        """Pause, resume or query; whether the node is paused now, and why."""
        ...


class NodeService:
    """Implements the transport's ``Handler`` for one node; gossip goes through the node's one
    inbound path (node/daemon/inbound.py), which the simulator shares.

    Args:
        port: the node, as far as the service needs it.
        inbound: the node's inbound path (which also says whether the node takes messages).
    """

    def __init__(self, port: ServicePort, inbound: Inbound) -> None:
        self.port = port
        self.inbound = inbound

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

    def is_revoked(self, node_id: str) -> bool:
        return self.port.is_revoked(node_id)

    def note_rejected(self, reason: Reason, detail: str) -> None:
        self.inbound.note_rejected(reason, detail)

    def _refuse(self, reason: Reason, detail: str, sender: str = "") -> NoReturn:
        self.inbound.refuse(reason, detail, sender)

    def _check_common(self, protocol_version: int, sender: str) -> None:
        self.inbound.admit(protocol_version, sender)

    async def rpc_hello(self, hello: Hello) -> Hello:
        sender = hello.self_.node_id
        self._check_common(hello.protocol_version, sender)
        differences = self.port.fingerprint.differences(hello.fingerprint, "we have", "you have")
        if differences:
            self._refuse(
                Reason.FINGERPRINT,
                "the task differs from this swarm's: " + "; ".join(differences),
                sender,
            )
        if sender == self.port.node_id:
            self._refuse(Reason.MALFORMED, "the caller claims this node's own id")
        try:
            return await self.port.welcome(hello)
        except Rejected as err:
            self._refuse(err.reason, err.detail, sender)

    async def rpc_swim(self, protocol_version: int, message: SwimMessage) -> str:
        self._check_common(protocol_version, message.sender)
        if message.sender == self.port.node_id:
            self._refuse(Reason.MALFORMED, "the sender claims this node's own id")
        if message.revocations:
            self.port.adopt_revocations(message.revocations, message.sender)
        self.port.receive_swim(message)
        return self.port.node_id

    async def rpc_pull_model(
        self, protocol_version: int, requester: str, have: bytes = b""
    ) -> AsyncIterator[ModelChunk]:
        self._check_common(protocol_version, "")
        # One copy of the model, cut into chunks as the stream drains: memory stays bounded.
        values, step = await self.port.model_copy()
        if have and await asyncio.to_thread(model_digest, values) == have:
            log.info("%s holds our model already: sent its name", requester[:8])
            yield ModelChunk(values.numel(), 0, b"", step, same=True)
            return
        # A model is a snapshot's bytes: the budget holds both (not the joiner's), and counts
        # them at once, so that joiners pulling together do not each find the same room.
        wait_s = self.port.claim_upload(4 * values.numel())
        if wait_s > 0:
            self._refuse(
                Reason.BUDGET_SPENT,
                f"the byte budget allows the model's {4 * values.numel()} bytes in {wait_s:.0f} s",
            )
        log.info("sending our model to %s (%d values)", requester[:8], values.numel())
        for chunk in iter_chunks(values, self.port.upload_chunk_values):
            nbytes = len(chunk.data)
            await self.port.pace_upload(nbytes, claimed=nbytes)  # a pull is upload, as gossip
            yield ModelChunk(values.numel(), chunk.offset, chunk.data, step)

    async def rpc_push_delta(self, delta: Delta) -> int:
        seq = await self.port.on_worker(
            self.inbound.push_delta(delta, wire_sizes.delta_nbytes(delta))
        )
        self.port.changed()
        return seq

    async def rpc_push_snapshot(
        self, header: SnapshotHeader, chunks: AsyncIterator[SnapshotChunk]
    ) -> int:
        sender = header.sender
        await self.port.on_worker(self.inbound.open_snapshot(header))
        if header.digest:  # named by its digest: the model is one this node holds, or none
            async for chunk in chunks:
                if chunk.data or chunk.offset:
                    self._refuse(Reason.MALFORMED, "a named snapshot carries values", sender)
            seq = await self.port.on_worker(
                self.inbound.apply_snapshot(header, _NONE, wire_sizes.snapshot_nbytes(header))
            )
            self.port.changed()
            return seq
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
        seq = await self.port.on_worker(
            self.inbound.apply_snapshot(header, values, wire_sizes.snapshot_nbytes(header))
        )
        self.port.changed()
        return seq

    async def rpc_status(self) -> NodeStatus:
        return await self.port.status()

    async def rpc_control(self, action: str, caller: ControlCaller) -> tuple[bool, str]:
        """Only the node itself (its own certificate) or an admin of the swarm's CA may pause
        or resume it, or ask; without TLS, only a caller on this machine."""
        if caller.tls:
            if caller.node_id != self.port.node_id and not caller.admin:
                detail = (
                    f"{caller.node_id[:8]} may not control this node: only its own certificate "
                    "or an admin's (murmur ca issue --admin) may"
                )
                self.note_rejected(Reason.IDENTITY, detail)
                raise Rejected(Reason.IDENTITY, detail)
        elif not caller.local:
            detail = "without TLS, only a caller on the node's own machine may control it"
            self.note_rejected(Reason.IDENTITY, detail)
            raise Rejected(Reason.IDENTITY, detail)
        return await self.port.control(action)
