"""A node that nobody can dial keeps dial-out sessions (node/transport/session.py) to the
members it needs: each of its neighbours (the topology gives it only members others can dial,
gossip/topology.py's reachable_graph) and its relays, the members its record names for everyone
else. It learns that it needs them at its join: the member it joins through cannot call it back.

Sessions that end (the member died, left, or restarted) are opened again while still wanted,
with a growing pause; the relays are always members whose session is up, so when a relay goes,
the record names another at once and spreads at the head of every membership message.

A relay that misbehaves is named no more, for a while (node/transport/forwarding.py has the
checks): one that passes on a call altered or replayed, at once; one that drops or holds back
the node's probes of it, after two in a row.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection

from gossip.relays import RELAYS, choose_relays
from node.runtime import Runtime
from node.transport.base import UNDIALLABLE_DOMAIN, Rejected, Transport, Unreachable

__all__ = ["RELAYS", "DialOut", "unreachable_address"]

log = logging.getLogger(__name__)

#: The pause before a session that ended is opened again: doubling from the first to the last.
RETRY_S = (0.5, 8.0)

#: How often each relay is probed, and how long a probe may take to come back through it (a
#: relay that holds calls back for longer is taken for one that drops them).
PROBE_EVERY_S = 2.0
PROBE_TIMEOUT_S = 2.0
#: Probes in a row that did not come back before a relay is named no more.
PROBE_MISSES = 2
#: How long a relay that misbehaved is not named again.
DISTRUST_S = 300.0


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
    probe_every_s: how often each relay is probed (None: never).
    """

    def __init__(
        self,
        transport: Transport,
        runtime: Runtime,
        own_address: Callable[[], str],
        on_relays: Callable[[tuple[str, ...]], None],
        probe_every_s: float | None = PROBE_EVERY_S,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
    ) -> None:
        self.transport = transport
        self.runtime = runtime
        self._own_address = own_address
        self._on_relays = on_relays
        self._probe_every_s = probe_every_s
        self._probe_timeout_s = probe_timeout_s
        #: Whether this node is behind NAT (found at its join).
        self.active = False
        self._wanted: set[str] = set()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._up: dict[str, asyncio.Event] = {}
        self.relays: tuple[str, ...] = ()
        #: Relays that misbehaved -> until when they are not named.
        self.distrusted: dict[str, float] = {}
        #: Relays found misbehaving so far (each time counts), and probes that came back.
        self.faults = 0
        self.probes = 0
        self._misses: dict[str, int] = {}
        self._probing: asyncio.Task[None] | None = None

    @property
    def up(self) -> frozenset[str]:
        return frozenset(a for a, e in self._up.items() if e.is_set())

    async def open(self, address: str, timeout_s: float) -> bool:
        """Hold a session to ``address`` (wanted until :meth:`want` says otherwise); returns
        whether it is up within ``timeout_s``."""
        self._wanted.add(address)
        self._start(address)
        if self._probing is None and self._probe_every_s is not None:
            self._probing = asyncio.ensure_future(self._probe(self._probe_every_s))
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
                await self.transport.hold_session(
                    address, self._own_address(), on_up, self.distrust
                )
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

    def distrust(self, relay: str, why: str) -> None:
        """``relay`` misbehaved: name another in its place (when one is up), for a while."""
        self.faults += 1
        self._misses.pop(relay, None)
        known = not self._trusted(relay)
        self.distrusted[relay] = self.runtime.clock.now() + DISTRUST_S
        if not known:  # a relay at it again is not news: logged once a while
            log.warning("relay %s misbehaved (%s): naming another", relay, why)
        self._update_relays()

    def _trusted(self, address: str) -> bool:
        until = self.distrusted.get(address)
        if until is None:
            return True
        if self.runtime.clock.now() < until:
            return False
        del self.distrusted[address]
        return True

    async def _probe(self, every_s: float) -> None:
        """Probe each relay, every ``every_s``: a call from this node to itself through it."""
        while True:
            await self.runtime.sleep(every_s)
            relays = [r for r in self.relays if r in self.up]
            results = await asyncio.gather(
                *(self._probe_one(r) for r in relays), return_exceptions=True
            )
            for relay, result in zip(relays, results, strict=True):
                if not isinstance(result, Exception):
                    self.probes += 1
                    self._misses.pop(relay, None)
                elif relay in self.up and relay in self.relays:  # an ended session is no sign
                    self._misses[relay] = misses = self._misses.get(relay, 0) + 1
                    if misses >= PROBE_MISSES:
                        self.distrust(relay, f"{misses} probes in a row failed: {result}")

    async def _probe_one(self, relay: str) -> None:
        await self.transport.probe_relay(relay, self._own_address(), self._probe_timeout_s)

    def _update_relays(self) -> None:
        """Relays: those named before that are still up and trusted, then others that are, by
        address. When none is trusted, those up are named all the same: a relay that drops
        some calls is better than none."""
        if not self.active:
            return
        up = {a for a in self.up if self._trusted(a)} or self.up
        relays = choose_relays(self.relays, up)
        if relays and relays != self.relays:
            self.relays = relays
            log.info("reached through relays %s", " ".join(relays))
            self._on_relays(relays)

    async def stop(self) -> None:
        self._wanted.clear()
        tasks = list(self._tasks.values())
        if self._probing is not None:
            tasks.append(self._probing)
            self._probing = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
