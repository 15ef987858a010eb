"""Mutual TLS on a live node: only holders of a valid certificate from the swarm's CA get in, and
a message may only speak for the node its certificate names."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import grpc.aio
import pytest

from gossip.messages import PROTOCOL_VERSION, Hello
from gossip.swim import MemberRecord
from node.daemon.node import Node
from node.security.identity import KEY_FILE
from node.security.pki import CA_CERT_FILE, CERT_FILE, TLS_NAME, TlsFiles, init_ca, issue_node
from node.transport.base import Reason, Rejected, Unreachable
from node.transport.grpc import GrpcTransport, GrpcTransportConfig
from protos import murmur_pb2 as pb
from protos import murmur_pb2_grpc as pb_grpc
from tests.node.helpers import config


def files(directory: Path) -> TlsFiles:
    """The TLS files as they are, unchecked (so that an expired certificate can be presented)."""
    return TlsFiles(
        (directory / KEY_FILE).read_bytes(),
        (directory / CERT_FILE).read_bytes(),
        (directory / CA_CERT_FILE).read_bytes(),
    )


@dataclass
class Swarm:
    node: Node
    tmp: Path

    async def ask(self, tls: TlsFiles | None) -> str:
        """The node's id as the Status RPC reports it, asked with ``tls`` (None: plain TCP)."""
        transport = GrpcTransport(GrpcTransportConfig(tls=tls))
        try:
            return (await transport.call_status(self.node.address, 3.0)).node_id
        finally:
            await transport.close(0)


@pytest.fixture
async def swarm(tmp_path: Path) -> AsyncIterator[Swarm]:
    init_ca(tmp_path / "ca")
    issue_node(tmp_path / "ca", tmp_path / "node", "node")
    cfg = config(tmp_path / "node", insecure=False, wait_members=2, wait_timeout_s=None)
    node = await Node.create(cfg)
    await node.start()
    yield Swarm(node, tmp_path)
    await node.stop(grace_s=0)


async def test_a_certificate_from_the_swarms_ca_gets_in(swarm: Swarm) -> None:
    issue_node(swarm.tmp / "ca", swarm.tmp / "me", "me")
    assert await swarm.ask(files(swarm.tmp / "me")) == swarm.node.node_id


async def test_no_certificate_another_ca_or_plain_tcp_is_refused(swarm: Swarm) -> None:
    init_ca(swarm.tmp / "other-ca")
    issue_node(swarm.tmp / "other-ca", swarm.tmp / "stranger", "stranger")
    for tls in (files(swarm.tmp / "stranger"), None):
        with pytest.raises(Unreachable):
            await swarm.ask(tls)
    # TLS, trusting the swarm's CA, but with no certificate of its own to show.
    ca_pem = files(swarm.tmp / "node").ca_pem
    options = [("grpc.ssl_target_name_override", TLS_NAME)]
    async with grpc.aio.secure_channel(
        swarm.node.address, grpc.ssl_channel_credentials(ca_pem), options=options
    ) as channel:
        stub = pb_grpc.MurmurStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Status(pb.StatusRequest(), timeout=3.0)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_an_expired_certificate_is_refused(swarm: Swarm) -> None:
    long_ago = datetime.now(UTC) - timedelta(days=30)
    issue_node(swarm.tmp / "ca", swarm.tmp / "old", "old", days=1, not_before=long_ago)
    with pytest.raises(Unreachable):
        await swarm.ask(files(swarm.tmp / "old"))


async def test_a_message_for_another_node_than_the_certificate_is_refused(swarm: Swarm) -> None:
    issue_node(swarm.tmp / "ca", swarm.tmp / "me", "me")
    before = swarm.node.peers.swim.records()
    impostor = MemberRecord("e" * 32, "127.0.0.1:9", 1)  # not the id of the certificate
    hello = Hello(PROTOCOL_VERSION, impostor, swarm.node.fingerprint, ())
    transport = GrpcTransport(GrpcTransportConfig(tls=files(swarm.tmp / "me")))
    try:
        with pytest.raises(Rejected) as info:
            await transport.call_hello(swarm.node.address, hello, 3.0)
    finally:
        await transport.close(0)
    assert info.value.reason is Reason.IDENTITY
    assert swarm.node.peers.swim.records() == before
    assert swarm.node.counters.rejected["identity"] == 1
