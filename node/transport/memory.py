"""An in-memory transport: nodes in one process call each other's handlers directly.

It behaves like the gRPC transport where the node can tell (refusals arrive as the same
:class:`Rejected`, an absent or failed peer as :class:`Unreachable`, snapshots in chunks), which the
shared contract test checks. Tests and the simulator use it; a ``drop`` rule loses messages
and a ``delay`` rule holds them on the loop's clock (so on a virtual-time loop a delay costs no
wall time). :class:`SeededFaults` makes both from one seed, as the simulator's lossy network
does. A delta stream stays first in, first out whatever the delays, as an HTTP/2 stream is;
independent calls (membership messages, a snapshot and a stream) overtake one another.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

import torch

from gossip.messages import PROTOCOL_VERSION, Delta, Hello, ModelChunk, SnapshotHeader
from gossip.swim import SwimMessage
from node.telemetry.status import NodeStatus
from node.transport.base import (
    Handler,
    Rejected,
    Route,
    SnapshotChunk,
    Unreachable,
    snapshot_chunks,
)

__all__ = ["MemoryNetwork", "MemoryTransport", "SeededFaults"]

T = TypeVar("T")

#: A stream has no deadline of its own; this only keeps a wedged callee from hanging a test.
STREAM_TIMEOUT_S = 3600.0

#: drop(caller_address, callee_address, message) -> True to lose the message.
DropRule = Callable[[str, str, object], bool]
#: delay(caller_address, callee_address, message) -> seconds before the callee sees it.
DelayRule = Callable[[str, str, object], float]


class SeededFaults:
    """Loss and delay from one seed, so a run repeats exactly.

    Args:
        loss: the chance that a message of a ``lossy`` kind is lost (the sender sees
            :class:`Unreachable`, as a gRPC call or stream that breaks).
        delay_s: each message is held a time drawn uniformly from this range; a spread lets
            independent messages overtake one another.
        seed: seeds the one RNG that both rules draw from.
        lossy: the kinds of message that may be lost; by default deltas and membership
            messages, as in the simulator-daemon contract test (a lost snapshot or hello is a
            failed call, which those already cover).
    """

    def __init__(
        self,
        loss: float = 0.0,
        delay_s: tuple[float, float] = (0.0, 0.0),
        seed: int = 0,
        lossy: tuple[type, ...] = (Delta, SwimMessage),
    ) -> None:
        if not 0.0 <= loss < 1.0:
            raise ValueError(f"loss must be in [0, 1), not {loss}")
        if not 0.0 <= delay_s[0] <= delay_s[1]:
            raise ValueError(
                f"delay_s must be a range (low, high) with 0 <= low <= high: {delay_s}"
            )
        self.loss = loss
        self.delay_s = delay_s
        self.lossy = lossy
        self._rng = random.Random(seed)
        self.lost = 0

    def drop(self, caller: str, callee: str, message: object) -> bool:
        if self.loss and isinstance(message, self.lossy) and self._rng.random() < self.loss:
            self.lost += 1
            return True
        return False

    def delay(self, caller: str, callee: str, message: object) -> float:
        low, high = self.delay_s
        return self._rng.uniform(low, high) if high > 0 else 0.0


class MemoryNetwork:
    """The address book of every in-memory node; ``drop`` decides which messages get lost,
    ``delay`` how long each is held (waiting with ``sleep``, the loop's by default)."""

    def __init__(
        self,
        drop: DropRule | None = None,
        delay: DelayRule | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.drop = drop
        self.delay = delay
        self._sleep = sleep
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

    async def carry(
        self, caller: str, callee: str, message: object, call: Callable[[], Coroutine[Any, Any, T]]
    ) -> T:
        """Run the handler's ``call`` once ``message`` has been held its delay."""
        delay_s = self.delay(caller, callee, message) if self.delay is not None else 0.0
        if delay_s > 0:
            await self._sleep(delay_s)
        return await call()


class MemoryTransport:
    def __init__(self, network: MemoryNetwork) -> None:
        self.network = network
        self.address = ""

    async def serve(self, handler: Handler, listen: str) -> str:
        self.address = self.network.register(listen, handler)
        return self.address

    async def call_hello(self, address: str, hello: Hello, timeout_s: float) -> Hello:
        handler = self.network.route(self.address, address, hello)
        call = self.network.carry(self.address, address, hello, lambda: handler.rpc_hello(hello))
        return await _within(call, timeout_s)

    async def call_push_delta(self, address: str, delta: Delta, timeout_s: float) -> int:
        handler = self.network.route(self.address, address, delta)
        call = self.network.carry(
            self.address, address, delta, lambda: handler.rpc_push_delta(delta)
        )
        return await _within(call, timeout_s)

    async def open_delta_stream(self, address: str) -> MemoryDeltaStream:
        return MemoryDeltaStream(self, address)

    async def call_push_snapshot(
        self, address: str, header: SnapshotHeader, values: torch.Tensor, timeout_s: float
    ) -> int:
        handler = self.network.route(self.address, address, header)

        async def chunks() -> AsyncIterator[SnapshotChunk]:
            for chunk in snapshot_chunks(header, values):
                yield chunk

        call = self.network.carry(
            self.address, address, header, lambda: handler.rpc_push_snapshot(header, chunks())
        )
        return await _within(call, timeout_s)

    async def call_status(self, address: str, timeout_s: float) -> NodeStatus:
        handler = self.network.route(self.address, address, "status")
        return await _within(handler.rpc_status(), timeout_s)

    async def call_swim(self, address: str, message: SwimMessage, timeout_s: float) -> str:
        handler = self.network.route(self.address, address, message)
        call = self.network.carry(
            self.address, address, message, lambda: handler.rpc_swim(PROTOCOL_VERSION, message)
        )
        return await _within(call, timeout_s)

    async def call_pull_model(
        self, address: str, requester: str, timeout_s: float, have: bytes = b""
    ) -> AsyncIterator[ModelChunk]:
        handler = self.network.route(self.address, address, "pull")
        chunks = aiter(handler.rpc_pull_model(PROTOCOL_VERSION, requester, have))

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

    async def hold_session(
        self,
        address: str,
        own_address: str,
        on_up: Callable[[str], None] | None = None,
        on_fault: Callable[[str, str], None] | None = None,
    ) -> None:
        raise Unreachable(
            "the in-memory network has no dial-out sessions: every address on it is dialable"
        )

    async def probe_relay(self, relay: str, own_address: str, timeout_s: float) -> None:
        raise Unreachable("the in-memory network has no relays")

    def holds_session(self, address: str, node_id: str) -> bool:
        return False

    def set_routes(self, routes: Mapping[str, Route]) -> None:
        """Nothing to route: every in-memory address is reached directly."""

    def session_figures(self) -> tuple[int, int]:
        return 0, 0

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
            network, caller = self.transport.network, self.transport.address
            handler = network.route(caller, self.address, delta)
            call = network.carry(caller, self.address, delta, lambda: handler.rpc_push_delta(delta))
            self._acks.put_nowait(await _within(call, STREAM_TIMEOUT_S))
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
