"""Nodes that nobody can dial take full part (issue 16), in-process over real gRPC and mutual
TLS: two nodes advertise an address where nothing listens, as a node behind NAT does without
knowing it. The member they join through cannot call them back; they then go by an address of
their own, open dial-out sessions, and train with the others over connections they opened. (The
same with real NAT routers, in network namespaces, is tests/e2e/test_nat.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import pytest

from gossip.swim import Status
from node.daemon.node import Node
from node.security.pki import init_ca, issue_node
from node.transport.grpc import GrpcTransport, GrpcTransportConfig
from tests.node.helpers import config, replica_matches_sender
from tests.node.test_tls import files

TIMEOUT_S = 90.0
#: Where the nodes behind "NAT" say they are: nothing listens there.
NOWHERE = "127.0.0.1:1"
NAMES = ("seed", "open", "nat-1", "nat-2")


async def start_swarm(
    tmp_path: Path, names: tuple[str, ...], nodes: dict[str, Node], join_all: bool = False
) -> None:
    """Start ``names`` in order (those named "nat..." advertise where nothing listens), each
    joining through the first (``join_all``: through every node started before it)."""
    init_ca(tmp_path / "ca")
    for i, name in enumerate(names):
        issue_node(tmp_path / "ca", tmp_path / name, name)
        transport = GrpcTransport(GrpcTransportConfig(tls=files(tmp_path / name)))
        join = [n.address for n in nodes.values()]
        cfg = config(
            tmp_path / name,
            insecure=False,
            shard_index=i,
            shard_count=len(names),
            wait_members=len(names),
            join=tuple(join if join_all else join[:1]),
            advertise=NOWHERE if name.startswith("nat") else None,
            **{"trainer.steps": 300, "gossip.idle_round_interval_s": None},
        )
        node = await Node.create(cfg, transport=transport)
        nodes[name] = node
        await node.start()


@pytest.fixture
async def swarm(tmp_path: Path) -> AsyncIterator[dict[str, Node]]:
    nodes: dict[str, Node] = {}
    try:
        await start_swarm(tmp_path, NAMES, nodes)
        yield nodes
    finally:
        for node in nodes.values():
            await node.stop(grace_s=0)


async def test_a_node_behind_nat_given_several_members_joins_through_them(
    tmp_path: Path,
) -> None:
    """Every join address is tried at once: each refuses the call-back, and each gets a
    session and a second hello."""
    nodes: dict[str, Node] = {}
    try:
        await start_swarm(tmp_path, ("seed", "open", "nat"), nodes, join_all=True)
        for node in nodes.values():
            await node.wait_until(node.training_finished.is_set, TIMEOUT_S)
        nat = nodes["nat"]
        assert set(nat.peers.swim.me.relays) == {nodes["seed"].address, nodes["open"].address}
        assert set(nat.peers.links) == {nodes["seed"].node_id, nodes["open"].node_id}
    finally:
        for node in nodes.values():
            await node.stop(grace_s=0)


def probed_its_relays(node: Node) -> bool:
    return node.peers.dialout.probes > 0


async def test_nodes_nobody_can_dial_join_and_train_through_sessions(
    swarm: dict[str, Node],
) -> None:
    reachable = {swarm["seed"].node_id, swarm["open"].node_id}
    for node in swarm.values():
        await node.wait_until(node.training_finished.is_set, TIMEOUT_S)
    for name in ("nat-1", "nat-2"):
        nat = swarm[name]
        me = nat.peers.swim.me
        assert me.address.endswith(".invalid:1")  # never dialled, unique to the node
        assert me.relays  # named, signed, and each a member it holds a session to
        assert set(me.relays) <= nat.peers.dialout.up
        # Its neighbours are members others can dial, and it sends to and hears from them.
        assert set(nat.peers.links) <= reachable
        assert nat.peers.links
        for j in nat.peers.links:
            other = next(n for n in swarm.values() if n.node_id == j)
            await nat.wait_until(partial(replica_matches_sender, nat, other), TIMEOUT_S)
            await other.wait_until(partial(replica_matches_sender, other, nat), TIMEOUT_S)
    for node in swarm.values():
        alive = {r.node_id for r in node.peers.swim.live_members() if r.status is Status.ALIVE}
        assert alive == {n.node_id for n in swarm.values()}, node.cfg.state_dir
        assert node.trainer.last_eval is not None
        assert node.trainer.last_eval.accuracy >= 0.9
    # The two behind "NAT" are never each other's neighbours: neither can dial the other.
    assert swarm["nat-2"].node_id not in swarm["nat-1"].peers.links
    # Each public node holds a session from both, and passed on membership calls for them
    # (nat-1 and nat-2 reach each other only through a relay).
    statuses = [await swarm[name].status() for name in ("seed", "open")]
    assert [s.sessions for s in statuses] == [2, 2]
    # Honest relays: nothing held against them once each node has probed them (every 2 s: a
    # quick swarm may finish training before the first probe).
    for n in ("nat-1", "nat-2"):
        await swarm[n].wait_until(partial(probed_its_relays, swarm[n]), TIMEOUT_S)
    assert [(await swarm[n].status()).relay_faults for n in ("nat-1", "nat-2")] == [0, 0]
    assert sum(s.relayed_bytes for s in statuses) > 0


async def test_when_a_relay_goes_the_nodes_behind_it_name_another(
    swarm: dict[str, Node],
) -> None:
    seed, other = swarm["seed"], swarm["open"]
    for node in swarm.values():
        await node.wait_until(node.training_finished.is_set, TIMEOUT_S)
    nats = [swarm["nat-1"], swarm["nat-2"]]
    assert all(seed.address in n.peers.swim.me.relays for n in nats)
    await seed.stop(grace_s=0)

    def renamed(nat: Node) -> bool:
        """The record ``open`` holds of ``nat`` names relays without the seed."""
        record = other.peers.swim.record(nat.node_id)
        return (
            record is not None
            and record.status is Status.ALIVE
            and bool(record.relays)
            and seed.address not in record.relays
        )

    for nat in nats:
        await other.wait_until(partial(renamed, nat), TIMEOUT_S)
        assert nat.peers.swim.me.relays == (other.address,)
