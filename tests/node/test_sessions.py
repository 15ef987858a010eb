"""Dial-out sessions over mutual TLS (node/transport/session.py): calls down a session are
judged by the certificate the member proved at its opening, a relay passes on only membership
calls signed by the member that made them, and it can neither forge nor alter one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
import pytest

from gossip.swim import Kind, SwimMessage
from node.security.pki import (
    TlsFiles,
    init_ca,
    issue_node,
    node_id_of_cert,
)
from node.transport import wire
from node.transport.base import Reason, Rejected, Unreachable
from node.transport.grpc import GrpcTransport, GrpcTransportConfig
from node.transport.grpc_server import REASON_KEY
from node.transport.session import forward_claim, sign
from tests.node.test_tls import files
from tests.node.test_transport_contract import UNDIALLABLE, RecordingHandler


@dataclass
class Trio:
    """``behind`` (nobody can dial it) holds a session to ``relay``; ``other`` holds none."""

    behind: GrpcTransport
    relay: GrpcTransport
    other: GrpcTransport
    handler: RecordingHandler
    relay_address: str
    ids: dict[str, str]
    tls: dict[str, TlsFiles]


@pytest.fixture
async def trio(tmp_path: Path) -> AsyncIterator[Trio]:
    init_ca(tmp_path / "ca")
    tls, ids = {}, {}
    for name in ("behind", "relay", "other"):
        issue_node(tmp_path / "ca", tmp_path / name, name)
        tls[name] = files(tmp_path / name)
        ids[name] = node_id_of_cert(tls[name].cert_pem)
    behind, relay, other = (GrpcTransport(GrpcTransportConfig(tls=tls[n])) for n in tls)
    handler = RecordingHandler()
    await behind.serve(handler, "127.0.0.1:0")
    relay_address = await relay.serve(RecordingHandler(), "127.0.0.1:0")
    await other.serve(RecordingHandler(), "127.0.0.1:0")
    up = asyncio.Event()
    holding = asyncio.ensure_future(
        behind.hold_session(relay_address, UNDIALLABLE, lambda _: up.set())
    )
    await asyncio.wait_for(up.wait(), 10)
    yield Trio(behind, relay, other, handler, relay_address, ids, tls)
    holding.cancel()
    await asyncio.gather(holding, return_exceptions=True)
    for transport in (other, relay, behind):
        await transport.close(0)


async def test_a_call_down_the_session_is_the_members_own(trio: Trio) -> None:
    ping = SwimMessage(Kind.PING, trio.ids["relay"], trio.relay_address, 1)
    assert await trio.relay.call_swim(UNDIALLABLE, ping, 5) == "b" * 32
    assert trio.handler.swims[-1][1] == ping
    # In another member's name: judged by the certificate proved at the opening.
    forged = SwimMessage(Kind.PING, trio.ids["other"], "x:1", 2)
    with pytest.raises(Rejected) as info:
        await trio.relay.call_swim(UNDIALLABLE, forged, 5)
    assert info.value.reason is Reason.IDENTITY
    assert trio.relay.sessions.held_by(UNDIALLABLE, trio.ids["behind"])


async def test_a_member_without_a_session_reaches_the_node_through_its_relay(trio: Trio) -> None:
    ping = SwimMessage(Kind.PING, trio.ids["other"], "other:1", 7)
    with pytest.raises(Unreachable):  # dialled: nobody there
        await trio.other.call_swim(UNDIALLABLE, ping, 2)
    trio.other.routes[UNDIALLABLE] = (trio.relay_address,)
    assert await trio.other.call_swim(UNDIALLABLE, ping, 5) == "b" * 32
    assert trio.handler.swims[-1][1] == ping  # the maker's, as it made it
    assert trio.relay.sessions.forwarded_bytes > 0


async def test_a_relay_cannot_forge_or_alter_a_forwarded_call(trio: Trio) -> None:
    peer = trio.relay.sessions.get(UNDIALLABLE)
    assert peer is not None
    honest = wire.swim_to_pb(SwimMessage(Kind.PING, trio.ids["other"], "o:1", 3), 1)
    message = honest.SerializeToString()
    signature = sign(trio.tls["other"].key_pem, forward_claim(UNDIALLABLE, "Swim", message))
    origin = (trio.tls["other"].cert_pem, signature)
    # Altered on the way: the signature no longer holds.
    altered = wire.swim_to_pb(SwimMessage(Kind.PING, trio.ids["other"], "o:1", 4), 1)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await peer.unary("Swim", altered.SerializeToString(), 5, origin=origin)
    assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED
    # Signed by the relay itself, in the other member's name: the message's sender is not the
    # certificate's.
    own = sign(trio.tls["relay"].key_pem, forward_claim(UNDIALLABLE, "Swim", message))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await peer.unary("Swim", message, 5, origin=(trio.tls["relay"].cert_pem, own))
    assert (REASON_KEY, "identity") in tuple(info.value.trailing_metadata() or ())
    assert len(trio.handler.swims) == 0
    # As signed, it goes through.
    answer = await peer.unary("Swim", message, 5, origin=origin)
    assert answer.has_message
    assert len(trio.handler.swims) == 1


async def test_a_second_node_cannot_take_over_the_session_address(trio: Trio) -> None:
    with pytest.raises(Rejected) as info:
        await trio.other.hold_session(trio.relay_address, UNDIALLABLE)
    assert info.value.reason is Reason.BAD_ADDRESS
    assert trio.relay.sessions.held_by(UNDIALLABLE, trio.ids["behind"])
