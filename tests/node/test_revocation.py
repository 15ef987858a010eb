"""Revocation: a list signed by the swarm's CA, dropped on one node, takes effect on all of them
without a restart."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path

import pytest

from gossip.swim import SwimConfig
from node.daemon.node import Node
from node.security.pki import init_ca, issue_node, load_tls
from node.security.revocation import REVOKED_FILE, parse_revocations, revoke
from node.transport.base import Reason, Rejected
from node.transport.grpc import GrpcTransport, GrpcTransportConfig
from tests.node.helpers import config, poll

TIMEOUT_S = 60.0


@pytest.fixture
async def swarm(tmp_path: Path) -> AsyncIterator[list[Node]]:
    """Three nodes over real gRPC with mutual TLS, each joining through the first."""
    init_ca(tmp_path / "ca")
    nodes: list[Node] = []
    try:
        for i in range(3):
            issue_node(tmp_path / "ca", tmp_path / f"n{i}", f"n{i}")
            cfg = config(
                tmp_path / f"n{i}",
                insecure=False,
                shard_index=i,
                shard_count=3,
                join=(nodes[0].address,) if nodes else (),
                membership=SwimConfig(period_s=0.2),
                **{"trainer.steps": 100_000},
            )
            node = await Node.create(cfg)
            nodes.append(node)
            await node.start()
        yield nodes
    finally:
        for node in nodes:
            await node.stop(grace_s=0)


def knows(node: Node, members: int) -> bool:
    return len(node.peers.view) == members


def has_dropped(node: Node, revoked: str) -> bool:
    return revoked not in node.peers.view and revoked not in node.peers.links


async def test_a_list_dropped_on_one_node_expels_the_revoked_node_everywhere(
    swarm: list[Node], tmp_path: Path
) -> None:
    a, b, c = swarm
    for n in swarm:
        await n.wait_until(partial(knows, n, 3), TIMEOUT_S)
    revoke(tmp_path / "ca", [c.node_id])
    shutil.copy(tmp_path / "ca" / REVOKED_FILE, tmp_path / "n0" / REVOKED_FILE)  # on a only

    for n in (a, b):  # b hears of it from a, over the membership protocol
        await n.wait_until(partial(has_dropped, n, c.node_id), TIMEOUT_S)
    assert (tmp_path / "n1" / REVOKED_FILE).read_bytes() == (
        tmp_path / "ca" / REVOKED_FILE
    ).read_bytes()  # b kept it for its next start
    assert a.trainer.running
    assert b.trainer.running

    # c's certificate is still valid, but no node answers it any more.
    transport = GrpcTransport(GrpcTransportConfig(tls=load_tls(tmp_path / "n2")))
    try:
        for n in (a, b):
            with pytest.raises(Rejected) as info:
                await transport.call_status(n.address, 5.0)
            assert info.value.reason is Reason.REVOKED
    finally:
        await transport.close(0)


def test_a_list_not_signed_by_the_swarms_ca_is_refused(tmp_path: Path) -> None:
    for name in ("ca", "other"):
        init_ca(tmp_path / name)
    forged = revoke(tmp_path / "other", ["a" * 32])
    with pytest.raises(ValueError, match="not signed by this swarm's CA"):
        parse_revocations(forged.blob, (tmp_path / "ca" / "ca_cert.pem").read_bytes())
    again = revoke(tmp_path / "other", ["b" * 32])  # versions grow, ids accumulate
    assert again.version == forged.version + 1
    assert again.node_ids == {"a" * 32, "b" * 32}


@pytest.fixture
async def lone(tmp_path: Path) -> AsyncIterator[Node]:
    """One node over mutual TLS whose key and certificate live in a TLS dir of their own."""
    init_ca(tmp_path / "ca")
    issue_node(tmp_path / "ca", tmp_path / "tls", "lone")
    cfg = config(
        tmp_path / "state",
        insecure=False,
        tls_dir=tmp_path / "tls",
        wait_members=2,
        wait_timeout_s=None,
    )
    node = await Node.create(cfg)
    await node.start()
    yield node
    await node.stop(grace_s=0)


def refused(node: Node, n: int) -> bool:
    return node.counters.rejected["bad_revocations"] >= n


async def soon(check: Callable[[], bool], what: str) -> None:
    """The file watcher wakes no waiter: poll it, with a deadline."""

    async def ask() -> bool:
        return check()

    await poll(ask, what, TIMEOUT_S)


async def test_a_bad_list_dropped_in_is_refused_and_counted_and_the_node_goes_on(
    lone: Node, tmp_path: Path
) -> None:
    path = tmp_path / "state" / REVOKED_FILE
    for i, blob in enumerate([b"[" * 100_000 + b"]" * 100_000, b"{" * 50_000, b"x" * (2 << 20)]):
        path.write_bytes(blob)
        await soon(partial(refused, lone, i + 1), f"refusal {i}")
    assert lone.failure is None
    # A good list dropped in the same place is taken at once.
    revoke(tmp_path / "ca", ["d" * 32])
    shutil.copy(tmp_path / "ca" / REVOKED_FILE, path)
    await soon(lambda: "d" * 32 in lone.peers.revocations.node_ids, "the good list")


async def test_lists_are_read_from_the_state_dir_whatever_the_tls_dir(
    lone: Node, tmp_path: Path
) -> None:
    revoke(tmp_path / "ca", ["e" * 32])
    shutil.copy(tmp_path / "ca" / REVOKED_FILE, tmp_path / "state" / REVOKED_FILE)
    await soon(lambda: "e" * 32 in lone.peers.revocations.node_ids, "the list")
    assert not (tmp_path / "tls" / REVOKED_FILE).exists()  # kept where it was read from
