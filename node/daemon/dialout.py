"""A node that nobody can dial keeps dial-out sessions (node/transport/session.py) to the
members it needs: each of its neighbours (the topology gives it only members others can dial,
gossip/topology.py's reachable_graph) and its relays, the members its record names for everyone
else. It learns that it needs them at its join: the member it joins through cannot call it back.

Sessions that end (the member died, left, or restarted) are opened again while still wanted,
with a growing pause; the relays are always members whose session is up, so when a relay goes,
the record names another at once and spreads at the head of every membership message.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection

from node.runtime import Runtime
from node.transport.base import UNDIALLABLE_DOMAIN, Rejected, Transport, Unreachable

__all__ = ["RELAYS", "DialOut", "unreachable_address"]

log = logging.getLogger(__name__)

#: Relays a record names (each a member holding a session from the node).
RELAYS = 2

#: The pause before a session that ended is opened again: doubling from the first to the last.
RETRY_S = (0.5, 8.0)


def unreachable_address(node_id: str, listen: str) -> str:
    """The address a node that nobody can dial goes by: a name that never resolves (".invalid",
    RFC 2606), so that nobody wastes a connection attempt on it, and unique to the node, since
    many nodes behind different routers share one private address. Its sessions carry it."""
    port = listen.rsplit(":", 1)[1]
    return f"{node_id[:16]}{UNDIALLABLE_DOMAIN}:{port}"


class DialOut:
    """Args:
    own_address: the address this node goes by (its member record's).
    on_relays: told the relays to name whenever they change (sorted; empty: none are up).
    """

    def __init__(
        self,
        transport: Transport,
        runtime: Runtime,
        own_address: Callable[[], str],
        on_relays: Callable[[tuple[str, ...]], None],
    ) -> None:
        self.transport = transport
        self.runtime = runtime
        self._own_address = own_address
        self._on_relays = on_relays
        #: Whether this node is behind NAT (found at its join).
        self.active = False
        self._wanted: set[str] = set()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._up: dict[str, asyncio.Event] = {}
        self.relays: tuple[str, ...] = ()

    @property
    def up(self) -> frozenset[str]:
        return frozenset(a for a, e in self._up.items() if e.is_set())

    async def open(self, address: str, timeout_s: float) -> bool:
        """Hold a session to ``address`` (wanted until :meth:`want` says otherwise); returns
        whether it is up within ``timeout_s``."""
        self._wanted.add(address)
        self._start(address)
        try:
            await asyncio.wait_for(self._up[address].wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def want(self, addresses: Collection[str]) -> None:
        """Hold sessions to exactly ``addresses`` (the neighbours) and the relays still up."""
        if not self.active:
            return
        self._wanted = set(addresses) | (set(self.relays) & self.up)
        for address in self._wanted:
            self._start(address)
        for address in list(self._tasks):
            if address not in self._wanted:
                self._tasks.pop(address).cancel()
                self._up.pop(address, None)
        self._update_relays()

    def _start(self, address: str) -> None:
        if address not in self._tasks or self._tasks[address].done():
            self._up.setdefault(address, asyncio.Event())
            self._tasks[address] = asyncio.ensure_future(self._hold(address))

    async def _hold(self, address: str) -> None:
        pause = RETRY_S[0]
        while address in self._wanted:
            event = self._up[address]

            def on_up(_: str, event: asyncio.Event = event) -> None:
                event.set()
                log.info("dial-out session to %s is up", address)
                self._update_relays()

            try:
                await self.transport.hold_session(address, self._own_address(), on_up)
            except (Unreachable, Rejected) as err:
                if event.is_set():
                    log.info("dial-out session to %s ended: %s", address, err)
                    pause = RETRY_S[0]
                else:
                    log.debug("no dial-out session to %s: %s", address, err)
            was_up = event.is_set()
            event.clear()
            if was_up:
                self._update_relays()
            if address not in self._wanted:
                break
            await self.runtime.sleep(pause)
            pause = min(2 * pause, RETRY_S[1])

    def _update_relays(self) -> None:
        """Relays: those named before that are still up, then others that are up, by address."""
        if not self.active:
            return
        up = self.up
        keep = [r for r in self.relays if r in up]
        more = sorted(up - set(keep))
        relays = tuple(sorted([*keep, *more][:RELAYS]))
        if relays and relays != self.relays:
            self.relays = relays
            log.info("reached through relays %s", " ".join(relays))
            self._on_relays(relays)

    async def stop(self) -> None:
        self._wanted.clear()
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
