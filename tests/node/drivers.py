"""What the driver tests on virtual time share: the loss and order cases, and a handler base.

Each case is a :class:`~node.transport.memory.SeededFaults` for the in-memory transport: loss of
deltas and membership messages as in the simulator-daemon contract test, and either one fixed
delay (every message arrives in the order sent) or a spread of delays (independent messages
overtake one another; a delta stream stays in order, as an HTTP/2 stream does).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gossip.messages import Delta, Hello, ModelChunk, SnapshotHeader
from gossip.swim import SwimMessage
from node.telemetry.status import NodeStatus
from node.transport.base import ControlCaller, Reason, Rejected, SnapshotChunk
from node.transport.memory import SeededFaults

__all__ = ["LOSSES", "ORDERS", "Refusing", "faults"]

LOSSES = [0.0, 0.1, 0.3]
#: The delay range of each order case, in seconds: fixed (in order) or spread (reordered).
ORDERS = {"in-order": (0.002, 0.002), "reordered": (0.0, 0.02)}

#: Every test runs under each loss and each order.
cases = pytest.mark.parametrize(
    ("loss", "order"), [(loss, order) for loss in LOSSES for order in ORDERS]
)


def faults(loss: float, order: str, seed: int = 0) -> SeededFaults:
    return SeededFaults(loss=loss, delay_s=ORDERS[order], seed=seed)


class Refusing:
    """A transport handler that refuses everything; the tests override what they serve."""

    async def rpc_hello(self, hello: Hello) -> Hello:
        raise Rejected(Reason.MALFORMED, "not served here")

    async def rpc_push_delta(self, delta: Delta) -> int:
        raise Rejected(Reason.MALFORMED, "not served here")

    async def rpc_push_snapshot(
        self, header: SnapshotHeader, chunks: AsyncIterator[SnapshotChunk]
    ) -> int:
        raise Rejected(Reason.MALFORMED, "not served here")

    async def rpc_status(self) -> NodeStatus:
        raise Rejected(Reason.MALFORMED, "not served here")

    async def rpc_control(self, action: str, caller: ControlCaller) -> tuple[bool, str]:
        raise Rejected(Reason.MALFORMED, "not served here")

    async def rpc_swim(self, protocol_version: int, message: SwimMessage) -> str:
        raise Rejected(Reason.MALFORMED, "not served here")

    def rpc_pull_model(
        self, protocol_version: int, requester: str, have: bytes = b""
    ) -> AsyncIterator[ModelChunk]:
        raise Rejected(Reason.MALFORMED, "not served here")

    def note_rejected(self, reason: Reason, detail: str) -> None:
        pass

    def is_revoked(self, node_id: str) -> bool:
        return False
