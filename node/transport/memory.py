"""An in-memory transport: nodes in one process call each other's handlers directly.

It behaves like the gRPC transport where the node can tell (refusals arrive as the same
:class:`Rejected`, an absent or failed peer as :class:`Unreachable`, snapshots in chunks), which the
shared contract test checks. Tests and the simulator use it; a ``drop`` rule injects faults.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

import torch

from gossip.messages import PROTOCOL_VERSION, Delta, Hello, ModelChunk, SnapshotHeader
from gossip.swim import SwimMessage
from node.telemetry.status import NodeStatus
from node.transport.base import Handler, Rejected, SnapshotChunk, Unreachable, iter_chunks

__all__ = ["MemoryNetwork", "MemoryTransport"]

T = TypeVar("T")

#: A stream has no deadline of its own; this only keeps a wedged callee from hanging a test.
STREAM_TIMEOUT_S = 3600.0

#: drop(caller_address, callee_address, message) -> True to lose the message.
DropRule = Callable[[str, str, object], bool]


class MemoryNetwork:
    """The address book of every in-memory node; ``drop`` decides which messages get lost."""

    def __init__(self, drop: DropRule | None = None) -> None:
        self.drop = drop
        self._handlers: dict[str, Handler] = {}
        self._ids = itertools.count()

    def register(self, listen: str, handler: Handler) -> str:
        address = listen if listen and not listen.endswith(":0") else f"mem:{next(self._ids)}"
        if address in self._handlers:
            raise OSError(f"address {address} is in use")
        self._handlers[address] = handler
        return address

    def unregister(self, address: str) -> None:
        self._handlers.pop(address, None)

    def route(self, caller: str, callee: str, message: object) -> Handler:
        handler = self._handlers.get(callee)
        if handler is None:
            raise Unreachable(f"nothing listens at {callee}")
        if self.drop is not None and self.drop(caller, callee, message):
            raise Unreachable(f"message from {caller} to {callee} was lost")
        return handler


class MemoryTransport:
    def __init__(self, network: MemoryNetwork) -> None:
        self.network = network
        self.address = ""

    async def serve(self, handler: Handler, listen: str) -> str:
        self.address = self.network.register(listen, handler)
        return self.address

    async def call_hello(self, address: str, hello: Hello, timeout_s: float) -> Hello:
        handler = self.network.route(self.address, address, hello)
        return await _within(handler.rpc_hello(hello), timeout_s)

    async def call_push_delta(self, address: str, delta: Delta, timeout_s: float) -> int:
        handler = self.network.route(self.address, address, delta)
        return await _within(handler.rpc_push_delta(delta), timeout_s)

    async def open_delta_stream(self, address: str) -> MemoryDeltaStream:
        return MemoryDeltaStream(self, address)

    async def call_push_snapshot(
        self, address: str, header: SnapshotHeader, values: torch.Tensor, timeout_s: float
    ) -> int:
        handler = self.network.route(self.address, address, header)

        async def chunks() -> AsyncIterator[SnapshotChunk]:
            for chunk in iter_chunks(values):
                yield chunk

        return await _within(handler.rpc_push_snapshot(header, chunks()), timeout_s)

    async def call_status(self, address: str, timeout_s: float) -> NodeStatus:
        handler = self.network.route(self.address, address, "status")
        return await _within(handler.rpc_status(), timeout_s)

    async def call_swim(self, address: str, message: SwimMessage, timeout_s: float) -> str:
        handler = self.network.route(self.address, address, message)
        return await _within(handler.rpc_swim(PROTOCOL_VERSION, message), timeout_s)

    async def call_pull_model(
        self, address: str, requester: str, timeout_s: float
    ) -> AsyncIterator[ModelChunk]:
        handler = self.network.route(self.address, address, "pull")
        chunks = aiter(handler.rpc_pull_model(PROTOCOL_VERSION, requester))

        async def next_chunk() -> ModelChunk | None:
            return await anext(chunks, None)

        # The whole transfer has one deadline, as a gRPC call has.
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            left = deadline - asyncio.get_running_loop().time()
            chunk = await _within(next_chunk(), left)
            if chunk is None:
                return
            yield chunk

    async def close(self, grace_s: float) -> None:
        if self.address:
            self.network.unregister(self.address)


async def _within(call: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """Run a handler call as a remote call would run: in its own task, with a deadline.

    Whatever goes wrong inside the callee other than a refusal (it was cancelled while shutting
    down, or it raised) reaches the caller as :class:`Unreachable`, as a gRPC status would.
    """
    task = asyncio.ensure_future(call)
    try:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
        # that arrives as the inner call completes, and the caller would never stop.
        async with asyncio.timeout(timeout_s):
            return await asyncio.shield(task)
    except TimeoutError as exc:
        task.cancel()
        raise Unreachable(f"no answer within {timeout_s:g} s") from exc
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            task.cancel()
            raise
        raise Unreachable("the callee dropped the call") from None
    except Rejected:
        raise
    except Exception as exc:
        raise Unreachable(f"the callee failed: {exc!r}") from exc


class MemoryDeltaStream:
    """Delivers each delta as it is sent; the first failure kills the stream, as over gRPC."""

    def __init__(self, transport: MemoryTransport, address: str) -> None:
        self.transport = transport
        self.address = address
        self._acks: asyncio.Queue[int | Exception] = asyncio.Queue()
        self._failure: Exception | None = None

    async def send(self, delta: Delta) -> None:
        if self._failure is not None:
            raise self._failure
        try:
            handler = self.transport.network.route(self.transport.address, self.address, delta)
            self._acks.put_nowait(await _within(handler.rpc_push_delta(delta), STREAM_TIMEOUT_S))
        except (Rejected, Unreachable) as err:
            self._failure = err
            self._acks.put_nowait(err)

    async def next_ack(self) -> int:
        ack = await self._acks.get()
        if isinstance(ack, Exception):
            raise ack
        return ack

    def cancel(self) -> None:
        if self._failure is None:
            self._failure = Unreachable("stream cancelled")
            self._acks.put_nowait(self._failure)
