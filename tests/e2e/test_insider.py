"""One insider among eight honest node processes, over mutual TLS.

The insider (tests/e2e/insider.py, a process of its own speaking the wire protocol) holds one
valid certificate of the swarm's CA. Seven honest nodes train; the insider joins; it pushes
snapshots of 1e38 to everyone; the eighth honest node joins through it, and is served a model of
1e38; the insider forges departures (DEAD records made of each member's own "alive" signature)
and replays old records; it floods everyone with identities of its own making. Then the CA
revokes it, on one node only. Throughout, every honest node answers Status, keeps honest
neighbours in its mix, knows no member but the eight and the insider, and its memory stays
within RSS_GROWTH of what it was when the insider came; at the end every honest node reaches
the accuracy target, and the revocation has reached every one of them within seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gossip.swim import Status
from node.cli.swarm import NodeProcess, SwarmConfig, node_argv, provision
from node.config import GossipConfig
from node.daemon.node import METRICS_FILE
from node.security.pki import issue_node, load_tls
from node.security.revocation import REVOKED_FILE
from node.telemetry.status import NodeStatus
from node.transport.base import Reason, Rejected
from node.transport.grpc import GrpcTransport, GrpcTransportConfig
from tests.node.helpers import poll

pytestmark = pytest.mark.e2e

HONEST, STEPS, TARGET = 8, 1500, 0.93
#: Paced devices (--step-time), so that training lasts through every attack.
CFG = SwarmConfig(
    nodes=HONEST,
    steps=STEPS,
    alpha=0.5,
    eval_every=250,
    step_time=0.04,
    gossip=GossipConfig(codec="int8"),
)
EXTRA = ["--swim-period", "0.5"]
TIMEOUT_S = 600.0
#: An honest node's resident memory may grow this much over its size when the insider came: a
#: few copies of the 4,810-parameter model and gRPC's buffers are far less; keeping what the
#: flood sends (thousands of identities, each with a key, a signature and a certificate, in
#: views, queues or channels) would not fit.
RSS_GROWTH = 100 << 20
#: The insider's revocation, dropped on one node, has reached every node within this.
REVOCATION_S = 30.0


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@dataclass
class Watch:
    """What the poll of every honest node saw, sample by sample."""

    failures: list[str] = field(default_factory=list)
    rss: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    #: (node index, in-mix honest neighbours) for every sample of a node that mixes.
    honest_in_mix: list[tuple[int, int]] = field(default_factory=list)
    strangers: set[str] = field(default_factory=set)
    statuses: dict[int, NodeStatus] = field(default_factory=dict)


class InsiderProcess:
    def __init__(self, tls_dir: Path) -> None:
        self.tls_dir = tls_dir
        self.proc: asyncio.subprocess.Process | None = None
        self.node_id = ""
        self.address = ""
        self._log = (tls_dir / "insider.log").open("wb")

    async def start(self, join: str) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.e2e.insider",
            str(self.tls_dir),
            join,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._log,
        )
        ready = json.loads(await self._line())
        self.node_id, self.address = ready["node_id"], ready["address"]

    async def _line(self) -> bytes:
        assert self.proc is not None
        assert self.proc.stdout is not None
        async with asyncio.timeout(120.0):
            line = await self.proc.stdout.readline()
        assert line, (self.tls_dir / "insider.log").read_text()[-3000:]
        return line

    async def do(self, command: dict[str, Any]) -> dict[str, int]:
        assert self.proc is not None
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        await self.proc.stdin.drain()
        done = json.loads(await self._line())
        assert done["done"] == command["do"]
        return dict(done["counts"])

    async def stop(self) -> None:
        try:
            await self._stop()
        finally:
            self._log.close()

    async def _stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            async with asyncio.timeout(20.0):
                await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


async def watch(
    transport: GrpcTransport,
    procs: list[NodeProcess],
    insider_id: str,
    seen: Watch,
    mixing_from: dict[int, float],
) -> None:
    """Every second: each honest node's status (it must answer), memory, neighbours, members."""
    while True:
        live = [p for p in procs if p.proc is not None and p.node_id]
        honest = {p.node_id for p in live}
        for p in live:
            assert not p.exited, f"node {p.index} exited:\n{p.log_tail()}"
        results = await asyncio.gather(
            *(transport.call_status(p.address, 10.0) for p in live), return_exceptions=True
        )
        now = time.monotonic()
        for p, s in zip(live, results, strict=True):
            assert p.proc is not None
            seen.rss[p.index].append(rss_bytes(p.proc.pid))
            if isinstance(s, BaseException):
                seen.failures.append(f"node {p.index}: {s!r}")
                continue
            seen.statuses[p.index] = s
            seen.strangers |= {m.node_id for m in s.members} - honest - {insider_id}
            if sum(s.member_counts.values()) > HONEST + 1:
                seen.strangers.add(f"node {p.index} knows {sum(s.member_counts.values())}")
            if now >= mixing_from.get(p.index, float("inf")) and not s.training_done:
                mixing = sum(n.in_mix and n.node_id in honest for n in s.neighbours)
                seen.honest_in_mix.append((p.index, mixing))
        await asyncio.sleep(1.0)


def live_ids(s: NodeStatus) -> set[str]:
    return {m.node_id for m in s.members if m.status in (Status.ALIVE, Status.SUSPECT)}


def knows_insider(s: NodeStatus, insider_id: str) -> bool:
    live = (Status.ALIVE, Status.SUSPECT)
    return any(m.node_id == insider_id and m.status in live for m in s.members)


@pytest.mark.timeout(900)
async def test_one_insider_cannot_eclipse_flood_poison_or_crash_the_swarm(tmp_path: Path) -> None:
    procs = [NodeProcess(i, tmp_path / f"node-{i}") for i in range(HONEST)]
    first, joiner = procs[:-1], procs[-1]
    tls = provision(CFG, tmp_path, [p.state_dir for p in procs])
    issue_node(tmp_path / "ca", tmp_path / "insider", "insider")
    transport = GrpcTransport(GrpcTransportConfig(tls=tls))
    as_insider = GrpcTransport(GrpcTransportConfig(tls=load_tls(tmp_path / "insider")))
    insider = InsiderProcess(tmp_path / "insider")
    seen = Watch()
    mixing_from: dict[int, float] = {}
    watcher: asyncio.Task[None] | None = None
    try:
        for p in first:
            join = first[p.index - 1].address if p.index else None
            await p.start(node_argv(CFG, p.index, p.state_dir, join, len(first)) + EXTRA, 120)

        async def training() -> bool:
            statuses = await asyncio.gather(*(transport.call_status(p.address, 10) for p in first))
            return all(s.step >= 100 for s in statuses)

        await poll(training, "the first seven to train", TIMEOUT_S)
        await insider.start(first[0].address)
        baseline = {p.index: rss_bytes(p.proc.pid) for p in first if p.proc is not None}
        for p in first:
            mixing_from[p.index] = time.monotonic()
        watcher = asyncio.create_task(watch(transport, procs, insider.node_id, seen, mixing_from))

        async def a_neighbour() -> bool:
            statuses = await asyncio.gather(*(transport.call_status(p.address, 10) for p in first))
            return any(n.node_id == insider.node_id for s in statuses for n in s.neighbours)

        # Snapshots of 1e38, in the insider's own name: refused where it is a neighbour (sent
        # before any node counts it one, every one is refused as from an unknown sender).
        await poll(a_neighbour, "an honest node to count the insider a neighbour", 30.0)
        await insider.do({"do": "poison"})
        # The eighth joins through the insider, which serves it a model of 1e38.
        argv = node_argv(CFG, joiner.index, joiner.state_dir, insider.address, HONEST) + EXTRA
        await joiner.start(argv, 120)
        assert joiner.proc is not None
        baseline[joiner.index] = rss_bytes(joiner.proc.pid)
        mixing_from[joiner.index] = time.monotonic() + 15.0  # links and snapshots come first
        # Departures it cannot sign, and old records; then thousands of made-up identities.
        await insider.do({"do": "forge", "seconds": 10})
        honest = {p.node_id for p in procs}

        async def all_alive() -> bool:
            statuses = await asyncio.gather(*(transport.call_status(p.address, 10) for p in procs))
            return all(honest <= live_ids(s) for s in statuses)

        # No record the insider can make moves a member it cannot sign for out of a view for
        # good (SWIM takes a death it only hears of as a suspicion the member refutes).
        await poll(all_alive, "every honest node to count every honest node alive", 30.0)
        counts = await insider.do({"do": "flood", "seconds": 10, "kind": "forged"})

        # The CA revokes it; the list is dropped on one node only.
        revoke = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "node", "ca", "revoke", str(tmp_path / "ca"), insider.node_id],
            stderr=subprocess.PIPE,
        )
        _, stderr = await revoke.communicate()
        assert revoke.returncode == 0, stderr
        shutil.copy(tmp_path / "ca" / REVOKED_FILE, first[0].state_dir / REVOKED_FILE)
        dropped_at = time.monotonic()

        lagging: dict[int, str] = {}

        async def gone_everywhere() -> bool:
            lagging.clear()
            for p in procs:
                if knows_insider(await transport.call_status(p.address, 10), insider.node_id):
                    lagging[p.index] = "still a member"
                    continue
                try:
                    await as_insider.call_status(p.address, 10)
                    lagging[p.index] = "answers it"
                except Rejected as err:
                    if err.reason is not Reason.REVOKED:
                        lagging[p.index] = f"refuses it as {err.reason}"
            return not lagging

        try:
            await poll(gone_everywhere, "the revocation to reach every node", REVOCATION_S)
        except AssertionError as err:
            raise AssertionError(f"{err}: {lagging}") from None
        revocation_s = time.monotonic() - dropped_at

        async def trained() -> bool:
            statuses = await asyncio.gather(*(transport.call_status(p.address, 10) for p in procs))
            return all(s.training_done and s.eval_accuracy >= 0 for s in statuses)

        await poll(trained, "every honest node to finish training", TIMEOUT_S)
        final = await asyncio.gather(*(transport.call_status(p.address, 10) for p in procs))
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await insider.stop()
        codes = [await p.stop(60) for p in procs]
        await transport.close(0)
        await as_insider.close(0)

    print(f"insider: {json.dumps(counts)}")
    print(f"revocation reached every node in {revocation_s:.1f} s")
    growth = {i: max(seen.rss[i]) - baseline[i] for i in baseline}
    print(f"RSS growth (MiB): { {i: round(g / 2**20, 1) for i, g in growth.items()} }")
    print(f"rejected: { {s.node_id[:8]: dict(s.rejected) for s in final} }")
    assert codes == [0] * HONEST
    assert seen.failures == [], seen.failures[:5]
    assert seen.strangers == set(), sorted(seen.strangers)[:5]
    assert all(g <= RSS_GROWTH for g in growth.values()), growth
    # Every honest node kept honest neighbours in its mix, at every sample.
    assert {i for i, _ in seen.honest_in_mix} == {p.index for p in procs}
    starved = [(i, n) for i, n in seen.honest_in_mix if n < 1]
    assert starved == [], starved[:10]
    # Each attack met its defence.
    assert counts.get("records sent (forged)", 0) >= 1000
    assert sum(s.rejected.get("unadmitted", 0) for s in final) > 0
    assert sum(s.rejected.get("implausible", 0) for s in final) > 0  # the poisoned snapshots
    pulls = [
        r
        for r in map(json.loads, (joiner.state_dir / METRICS_FILE).read_text().splitlines())
        if r["event"] == "pulled_model"
    ]
    assert len(pulls) == 1
    assert pulls[0]["source"] != insider.address
    assert counts.get("poisoned_pulls_served", 0) >= 1  # and it was refused
    for s in final:
        assert s.eval_accuracy >= TARGET, (s.node_id[:8], s.eval_accuracy)
