"""The SWIM membership protocol, driven on the node's event loop.

:class:`gossip.swim.Swim` decides; this module only keeps its timers and delivers its messages.
Every message is a call of its own (a ping's ack is a separate call back), sent without waiting
for it: a lost or refused message is exactly what the protocol is built to tolerate, so a failed
call is only logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace

from gossip.swim import Kind, MemberRecord, Outgoing, Swim, SwimMessage
from node.daemon.aio import cancel_and_wait
from node.runtime import Runtime
from node.transport.base import Rejected, Transport, Unreachable

__all__ = ["Membership"]

log = logging.getLogger(__name__)

#: Calls in flight beyond which new messages are dropped (a slow network must not pile them up).
MAX_IN_FLIGHT = 256


class Membership:
    """Args:
    swim: the protocol's state.
    runtime: the clock the protocol's deadlines are read on (the one ``swim`` reads).
    on_change: awaited with the records whose status or address changed, from the one task
        that runs the protocol, so changes are handled one batch at a time and in order.
    """

    def __init__(
        self,
        swim: Swim,
        transport: Transport,
        runtime: Runtime,
        on_change: Callable[[list[MemberRecord]], Awaitable[None]],
        attach: Callable[[], bytes] = lambda: b"",
    ) -> None:
        self.swim = swim
        self.transport = transport
        self.clock = runtime.clock
        self._on_change = on_change
        self._attach = attach
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sends: set[asyncio.Task[None]] = set()
        self._handling: set[asyncio.Future[None]] = set()
        self.dropped = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="membership")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        for task in list(self._sends):
            await cancel_and_wait(task)
        handling = list(self._handling)
        for future in handling:
            future.cancel()
        await asyncio.gather(*handling, return_exceptions=True)

    @property
    def timeout_s(self) -> float:
        return self.swim.cfg.ping_timeout_s

    # -- the protocol -------------------------------------------------------------------------

    def receive(self, message: SwimMessage) -> None:
        """Handle a message that arrived; its answers go out, and the protocol task looks at
        what changed."""
        self.send(self.swim.receive(message))
        self._wake.set()

    def poke(self) -> None:
        """Something changed outside the protocol: let its task look now."""
        self._wake.set()

    def _outgoing(self, out: Outgoing) -> SwimMessage:
        extra = self._attach()
        return replace(out.message, revocations=extra) if extra else out.message

    def merge(self, records: Iterable[MemberRecord], relayer: str | None = None) -> None:
        """Records learned outside the protocol (a hello); the protocol task reacts.
        ``relayer``: who sent them, if we did not ask (a joiner's list: its rate applies)."""
        self.swim.merge(records, relayer)
        self._wake.set()

    async def settle(self) -> None:
        """Handle pending changes now (the caller needs the topology that follows from them).

        Once drained, changes are handled to the end even if the caller is cancelled (a joiner
        that got in elsewhere drops its other hellos): otherwise they would be lost, and the
        topology would miss a member until the next change.
        """
        changes = self.swim.drain_changes()
        if changes:
            task = asyncio.ensure_future(self._on_change(changes))
            self._handling.add(task)
            task.add_done_callback(self._handling.discard)
            await asyncio.shield(task)

    async def _run(self) -> None:
        while True:
            try:
                self.send(self.swim.tick())
                await self.settle()
            except Exception:  # the failure detector must outlive a bug in a reaction to it
                log.exception("membership: handling a change failed")
            self._wake.clear()
            delay = self.swim.next_deadline() - self.clock.now()
            if delay > 0:
                try:
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                except TimeoutError:
                    pass

    def send(self, outgoing: Iterable[Outgoing]) -> None:
        for out in outgoing:
            if len(self._sends) >= MAX_IN_FLIGHT:
                self.dropped += 1
                continue
            task = asyncio.create_task(self._deliver(out))
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)

    async def _deliver(self, out: Outgoing) -> None:
        # A whole member list may take longer than a ping on a slow link; it has a period.
        full = out.message.kind in (Kind.PUSH_PULL, Kind.PUSH_PULL_REPLY)
        timeout_s = self.swim.cfg.period_s if full else self.timeout_s
        try:
            await self.transport.call_swim(out.address, self._outgoing(out), timeout_s)
        except (Unreachable, Rejected) as err:
            log.debug("swim %s to %s: %s", out.message.kind, out.address, err)

    async def check_address(self, address: str, timeout_s: float) -> str:
        """Ping ``address`` once, now; returns the id of the node that answers there.

        The deadline is the caller's, not a ping timeout: this is a one-off check of a joiner,
        whose first connection may queue behind a model transfer on a slow link.

        Raises:
            Unreachable, Rejected: nobody (or no murmur node) answers within ``timeout_s``.
        """
        out = self.swim.ping(address)
        return await self.transport.call_swim(out.address, out.message, timeout_s)

    async def leave(self, first: Iterable[str], fanout: int) -> None:
        """Tell ``first`` (the neighbours) and others, ``fanout`` in all, that this node leaves,
        and wait (a ping timeout at most) for the calls to land."""
        outgoing = self.swim.leave(fanout, first)
        sends = [self.transport.call_swim(o.address, o.message, self.timeout_s) for o in outgoing]
        results = await asyncio.gather(*sends, return_exceptions=True)
        told = sum(not isinstance(r, BaseException) for r in results)
        log.info("announced our departure to %d of %d members", told, len(outgoing))
