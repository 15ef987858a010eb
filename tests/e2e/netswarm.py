"""A swarm of real node processes over mutual TLS, one per host of a :class:`Testnet`, and a
watch on it: every node's Status polled through the test, the rates of its gossip rounds and
steps over a window, and every member any node ever saw dead. Shared by
tests/e2e/test_lossy_links.py and bench/lossy_links.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from gossip.swim import Status
from node.cli.swarm import NodeProcess, SwarmConfig, node_argv, provision
from node.security.pki import load_tls
from node.telemetry.status import NodeStatus
from node.transport.base import Rejected, Unreachable
from node.transport.grpc import GrpcTransport, GrpcTransportConfig
from tests.netns import Testnet

__all__ = ["LinkRates", "NetSwarm", "Rates"]

START_S = 120.0  # a node's start on two busy cores (torch's import alone takes seconds)
STATUS_S = 5.0  # one Status call; a lossy link retransmits, so not much less


@dataclass(frozen=True)
class Rates:
    """Per-node averages over a window."""

    rounds_per_s: float
    steps_per_s: float
    window_s: float


#: Deltas a second on each link over a window: (sender's host, receiver's host) -> rate.
LinkRates = dict[tuple[int, int], float]


@dataclass
class _Sample:
    at: float
    rounds: dict[str, int] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)
    #: (sender's host, receiver's host) -> deltas the sender has sent on that link.
    deltas: dict[tuple[int, int], int] = field(default_factory=dict)


class NetSwarm:
    """``cfg.nodes`` nodes, node ``i`` on host ``i`` of ``net``, all joining through node 0."""

    def __init__(self, net: Testnet, cfg: SwarmConfig, workdir: Path) -> None:
        self.net, self.cfg, self.workdir = net, cfg, workdir
        self.procs = [NodeProcess(i, workdir / f"node-{i}") for i in range(cfg.nodes)]
        provision(cfg, workdir, [p.state_dir for p in self.procs])  # mutual TLS
        self.transport = GrpcTransport(GrpcTransportConfig(tls=load_tls(workdir / "runner")))
        #: (observer, member) pairs where the observer's view ever held the member dead.
        self.deaths: set[tuple[str, str]] = set()
        self.last: dict[str, NodeStatus] = {}
        self._watch: asyncio.Task[None] | None = None

    def _argv(self, i: int, join: str | None) -> list[str]:
        argv = node_argv(self.cfg, i, self.procs[i].state_dir, join)
        argv[argv.index("--listen") + 1] = f"{self.net.address(i)}:0"
        return [*self.net.exec_argv(i), *argv]

    async def start(self, order: list[int] | None = None) -> None:
        """Start node 0, then every other at once through it (launched in ``order``)."""
        first = self.procs[0]
        await first.start(self._argv(0, None), START_S)
        order = list(range(1, len(self.procs))) if order is None else order
        if sorted(order) != list(range(1, len(self.procs))):
            raise ValueError(f"order {order}: expected every node but the first, once")
        joiners = [self.procs[i] for i in order]
        await asyncio.gather(
            *(p.start(self._argv(p.index, first.address), START_S) for p in joiners)
        )

    async def stop(self) -> list[int]:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        codes = await asyncio.gather(*(p.stop(60) for p in self.procs))
        await self.transport.close(0)
        return list(codes)

    async def _status(self, p: NodeProcess) -> NodeStatus | None:
        try:
            return await self.transport.call_status(p.address, STATUS_S)
        except (Unreachable, Rejected):
            return None

    async def poll(self) -> list[NodeStatus | None]:
        """Every node's Status now (None where it did not answer); notes what they saw dead."""
        for p in self.procs:
            if p.exited:
                raise AssertionError(f"node {p.index} exited:\n{p.log_tail()}")
        got = await asyncio.gather(*(self._status(p) for p in self.procs))
        for s in got:
            if s is not None:
                self.last[s.node_id] = s
                dead = {m.node_id for m in s.members if m.status is Status.DEAD}
                self.deaths |= {(s.node_id, d) for d in dead}
                if s.member_counts.get("dead", 0) > len(dead):  # past the members a status names
                    self.deaths.add((s.node_id, "?"))
        return list(got)

    def watch(self, interval_s: float = 0.5) -> None:
        """Poll in the background until stopped, so that no death between two phases goes
        unseen (a node declared dead and back alive within ``interval_s`` still may)."""

        async def run() -> None:
            while True:
                await self.poll()
                await asyncio.sleep(interval_s)  # a polling period, not a wait for an event

        self._watch = asyncio.create_task(run())

    async def _sample(self) -> _Sample:
        while True:
            got = await self.poll()
            if all(s is not None for s in got):
                at = time.monotonic()
                host = {p.address: p.index for p in self.procs}
                return _Sample(
                    at,
                    {s.node_id: s.rounds for s in got if s is not None},
                    {s.node_id: s.step for s in got if s is not None},
                    {
                        (i, host[n.address]): n.deltas_sent
                        for i, s in enumerate(got)
                        if s is not None
                        for n in s.neighbours
                        if n.address in host
                    },
                )

    async def rates(self, window_s: float) -> Rates:
        """Rounds and steps per second per node, averaged over the nodes, over ``window_s``."""
        a = await self._sample()
        await asyncio.sleep(window_s)  # the window a rate is measured over
        b = await self._sample()
        dt = b.at - a.at
        n = len(self.procs)
        rounds = sum(b.rounds[i] - a.rounds[i] for i in a.rounds) / n / dt
        steps = sum(b.steps[i] - a.steps[i] for i in a.steps) / n / dt
        return Rates(rounds, steps, dt)

    async def link_codecs(self) -> dict[tuple[int, int], str]:
        """The codec each link (i, j) encodes its deltas with, as node i's Status says."""
        got = await self.poll()
        host = {p.address: p.index for p in self.procs}
        return {
            (i, host[n.address]): n.codec
            for i, s in enumerate(got)
            if s is not None
            for n in s.neighbours
            if n.address in host
        }

    async def link_rates(self, window_s: float) -> LinkRates:
        """Deltas a second on each link that was a link at both ends of ``window_s``."""
        a = await self._sample()
        await asyncio.sleep(window_s)  # the window a rate is measured over
        b = await self._sample()
        dt = b.at - a.at
        return {k: (b.deltas[k] - a.deltas[k]) / dt for k in a.deltas.keys() & b.deltas.keys()}
