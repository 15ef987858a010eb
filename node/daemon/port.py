"""The node as its service sees it (node/daemon/service.py :class:`ServicePort`): each inbound
call routed to the one part that owns what it touches."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import torch

from gossip.messages import Hello, TaskFingerprint
from gossip.swim import SwimMessage
from node.daemon.gossiper import Gossiper
from node.daemon.peers import Peers
from node.daemon.signals import Signals
from node.daemon.steps import Steps, run_on
from node.daemon.trainer import Trainer
from node.telemetry.status import NodeStatus
from node.transport.base import CHUNK_VALUES

__all__ = ["DaemonPort"]

T = TypeVar("T")


class DaemonPort:
    """Args:
    node_id: the node's id.
    fingerprint: its task and codec.
    peers: members, revocations and SWIM.
    gossiper: the worker where the gossip state lives, and the model copy it serves.
    trainer: the step the served model is at.
    signals: told when an inbound message changed the state.
    status: the node's status.
    control: pauses, resumes or queries the node (``murmur ctl``).
    """

    def __init__(
        self,
        node_id: str,
        fingerprint: TaskFingerprint,
        peers: Peers,
        gossiper: Gossiper,
        trainer: Trainer,
        signals: Signals,
        status: Callable[[], Awaitable[NodeStatus]],
        control: Callable[[str], Awaitable[tuple[bool, str]]],
    ) -> None:
        self.node_id = node_id
        self.fingerprint = fingerprint
        self._peers = peers
        self._gossiper = gossiper
        self._trainer = trainer
        self._signals = signals
        self._status = status
        self._control = control

    def is_revoked(self, node_id: str) -> bool:
        return node_id in self._peers.revocations.node_ids

    async def welcome(self, hello: Hello) -> Hello:
        return await self._peers.introductions.welcome(hello)

    def adopt_revocations(self, blob: bytes, source: str) -> Any:
        return self._peers.adopt_revocations(blob, source)

    def receive_swim(self, message: SwimMessage) -> None:
        self._peers.membership.receive(message)

    async def model_copy(self) -> tuple[torch.Tensor, int]:
        values = await self._gossiper.model_copy()
        return values, self._trainer.step

    @property
    def upload_chunk_values(self) -> int:
        outflow = self._peers.outflow
        chunk = None if outflow is None else outflow.chunk_bytes
        return CHUNK_VALUES if chunk is None else max(1024, min(CHUNK_VALUES, chunk // 4))

    async def pace_upload(self, nbytes: int, claimed: int = 0) -> None:
        if self._peers.outflow is not None:
            await self._peers.outflow.take(nbytes, claimed)

    def claim_upload(self, nbytes: int) -> float:
        outflow = self._peers.outflow
        budget = None if outflow is None else outflow.budget
        return 0.0 if budget is None else budget.claim(nbytes)

    async def on_worker(self, steps: Steps[T]) -> T:
        return await run_on(steps, self._gossiper.run)

    def changed(self) -> None:
        self._signals.changed()

    async def status(self) -> NodeStatus:
        return await self._status()

    async def control(self, action: str) -> tuple[bool, str]:
        return await self._control(action)
