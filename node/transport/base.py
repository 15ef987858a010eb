"""The transport interface: inbound ``Handler`` (rpc_*) and outbound ``Transport`` (call_*).

Both speak the core's dataclasses. A transport carries messages and maps refusals both ways:
a handler raises :class:`Rejected`; the caller's ``call_*`` raises the same :class:`Rejected`,
whatever travelled in between. Failing to reach the peer at all raises :class:`Unreachable`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

from gossip.messages import Delta, Hello, ModelChunk, SnapshotHeader
from gossip.refusals import REFUSALS, Reason
from gossip.swim import SwimMessage
from node.telemetry.status import NodeStatus

if TYPE_CHECKING:  # torch only where tensors are chunked: `murmur status` does without it
    import torch

__all__ = [
    "CONTROL_ACTIONS",
    "INVALID_ARGUMENT_REASONS",
    "UNDIALLABLE_DOMAIN",
    "ControlCaller",
    "DeltaStream",
    "Handler",
    "HandshakeFailed",
    "Reason",
    "Rejected",
    "Route",
    "SnapshotChunk",
    "Transport",
    "Unreachable",
    "iter_chunks",
    "snapshot_chunks",
]

#: The domain of the addresses that nodes nobody can dial go by (node/daemon/dialout.py): a
#: name under ".invalid" never resolves (RFC 2606).
UNDIALLABLE_DOMAIN = ".unreachable.invalid"

#: Values per snapshot chunk (1 MiB of float32).
CHUNK_VALUES = 1 << 18

#: Reasons that mean the message itself is wrong (INVALID_ARGUMENT); the others mean it does not
#: fit the receiver's state (FAILED_PRECONDITION). Classified in gossip/refusals.py.
INVALID_ARGUMENT_REASONS = frozenset(r for r, c in REFUSALS.items() if c.invalid_argument)


class Route(NamedTuple):
    """How a member that nobody can dial is reached: its id (its answers must be signed by
    it) and the relays its record names."""

    node_id: str
    relays: tuple[str, ...]


class Rejected(Exception):
    """The receiver refused a message; its state did not change."""

    def __init__(self, reason: Reason, detail: str) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


class Unreachable(Exception):
    """The peer could not be reached, or did not answer in time."""


class HandshakeFailed(Unreachable):
    """The peer was reached, but the TLS handshake with it failed (a certificate from another
    CA, expired, or one side speaking plain TCP): retrying will not change it."""


#: What ``murmur ctl`` may ask of a node.
CONTROL_ACTIONS = ("query", "pause", "resume")


@dataclass(frozen=True)
class ControlCaller:
    """Who asks to control a node, as the transport found out.

    Args:
        tls: the call came under mutual TLS (else plain TCP).
        node_id: under TLS, the id its certificate names.
        admin: under TLS, its certificate is an admin's of the swarm's CA.
        local: the call came from this machine (loopback).
    """

    tls: bool
    node_id: str = ""
    admin: bool = False
    local: bool = False


@dataclass(frozen=True)
class SnapshotChunk:
    offset: int  # index of the first value
    data: bytes  # little-endian float32


def iter_chunks(values: torch.Tensor, chunk_values: int = CHUNK_VALUES) -> Iterator[SnapshotChunk]:
    """Cut a flat float32 vector into chunks, each copied to the host only when it is due."""
    from gossip.codecs import tensor_to_bytes

    for offset in range(0, values.numel(), chunk_values):
        yield SnapshotChunk(offset, tensor_to_bytes(values[offset : offset + chunk_values]))


def snapshot_chunks(header: SnapshotHeader, values: torch.Tensor) -> Iterator[SnapshotChunk]:
    """A snapshot's chunks: one of no values for a snapshot named by its digest."""
    if header.digest:
        yield SnapshotChunk(0, b"")
        return
    yield from iter_chunks(values)


class DeltaStream(Protocol):
    """An open, ordered stream of deltas to one peer, each acknowledged once applied.

    After the peer refuses a delta the stream is dead: ``next_ack`` (and any later ``send``)
    raises the :class:`Rejected`, or :class:`Unreachable` when the connection failed, and the
    sender must open a new stream.
    """

    async def send(self, delta: Delta) -> None: ...

    async def next_ack(self) -> int:
        """Waits for the next acknowledgement; returns the peer's replica sequence number."""
        ...

    def cancel(self) -> None:
        """Abandon the stream at once; deltas not yet applied are dropped."""
        ...


class Handler(Protocol):
    """A node's inbound side, the same whichever transport delivers."""

    async def rpc_hello(self, hello: Hello) -> Hello: ...

    async def rpc_push_delta(self, delta: Delta) -> int:
        """Returns the replica's sequence number after applying the delta."""
        ...

    async def rpc_push_snapshot(
        self, header: SnapshotHeader, chunks: AsyncIterator[SnapshotChunk]
    ) -> int: ...

    async def rpc_status(self) -> NodeStatus: ...

    async def rpc_swim(self, protocol_version: int, message: SwimMessage) -> str:
        """Takes one membership message; returns this node's id."""
        ...

    def rpc_pull_model(
        self, protocol_version: int, requester: str, have: bytes = b""
    ) -> AsyncIterator[ModelChunk]:
        """This node's current model, in chunks; or, when it is the model of digest ``have``
        (the requester's own), one chunk that says so."""
        ...

    async def rpc_control(self, action: str, caller: ControlCaller) -> tuple[bool, str]:
        """Pause, resume or query the node (``murmur ctl``); returns whether it is paused
        and why. Raises :class:`Rejected` (``identity``) for a caller that may not ask."""
        ...

    def note_rejected(self, reason: Reason, detail: str) -> None:
        """Counts a message the transport refused before it could reach an rpc_* method."""
        ...

    def is_revoked(self, node_id: str) -> bool:
        """Whether calls from the node with this (certified) id are to be refused."""
        ...


class Transport(Protocol):
    """Serves one handler and calls other nodes."""

    async def serve(self, handler: Handler, listen: str) -> str:
        """Starts serving; returns the address actually bound (port 0 resolved)."""
        ...

    async def call_hello(self, address: str, hello: Hello, timeout_s: float) -> Hello: ...

    async def call_push_delta(self, address: str, delta: Delta, timeout_s: float) -> int: ...

    async def open_delta_stream(self, address: str) -> DeltaStream: ...

    async def call_push_snapshot(
        self, address: str, header: SnapshotHeader, values: torch.Tensor, timeout_s: float
    ) -> int: ...

    async def call_status(self, address: str, timeout_s: float) -> NodeStatus: ...

    async def call_swim(self, address: str, message: SwimMessage, timeout_s: float) -> str:
        """Delivers one membership message; returns the id of the node that took it."""
        ...

    def call_pull_model(
        self, address: str, requester: str, timeout_s: float, have: bytes = b""
    ) -> AsyncIterator[ModelChunk]:
        """The model of the node at ``address``, chunk by chunk, as they arrive (one chunk
        that says it is the same, when it is the model of digest ``have``)."""
        ...

    async def hold_session(
        self,
        address: str,
        own_address: str,
        on_up: Callable[[str], None] | None = None,
        on_fault: Callable[[str, str], None] | None = None,
    ) -> None:
        """Open a dial-out session to ``address`` and serve the calls that come down it until
        it ends (node/transport/session.py); raises Unreachable or Rejected when it does.
        ``on_fault`` hears of each call the member passed on for another altered or replayed
        (the member's address, what was wrong)."""
        ...

    async def probe_relay(self, relay: str, own_address: str, timeout_s: float) -> None:
        """A call from this node to itself through ``relay`` (node/transport/forwarding.py);
        raises Unreachable or Rejected unless it comes back in time, as sent."""
        ...

    def holds_session(self, address: str, node_id: str) -> bool:
        """Whether the node ``node_id`` at ``address`` holds a session to this one."""
        ...

    def set_routes(self, routes: Mapping[str, Route]) -> None:
        """Addresses nobody can dial -> their node, and the relays that forward membership
        calls for it."""
        ...

    def session_figures(self) -> tuple[int, int]:
        """(dial-out sessions held to this node now, bytes it passed on as a relay)."""
        ...

    async def close(self, grace_s: float) -> None:
        """Stops serving (in-flight calls get ``grace_s`` to finish) and closes every channel."""
        ...
