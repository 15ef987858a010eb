"""Dial-out sessions over mutual TLS (node/transport/session.py): calls down a session are
judged by the certificate the member proved at its opening, a relay passes on only membership
calls signed by the member that made them, and it can neither forge, alter nor replay one
(node/transport/forwarding.py); what only a relay could have done wrong is held against it."""

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
from node.transport.base import Reason, Rejected, Route, Unreachable
from node.transport.forwarding import Forwarder
from node.transport.grpc import GrpcTransport, GrpcTransportConfig
from node.transport.grpc_server import REASON_KEY
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
    #: (relay, what it did) for each forwarded call ``behind`` held against the relay.
    faults: list[tuple[str, str]]


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
    faults: list[tuple[str, str]] = []
    holding = asyncio.ensure_future(
        behind.hold_session(
            relay_address, UNDIALLABLE, lambda _: up.set(), lambda *f: faults.append(f)
        )
    )
    await asyncio.wait_for(up.wait(), 10)
    yield Trio(behind, relay, other, handler, relay_address, ids, tls, faults)
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
    trio.other.routes[UNDIALLABLE] = Route(trio.ids["behind"], (trio.relay_address,))
    assert await trio.other.call_swim(UNDIALLABLE, ping, 5) == "b" * 32
    assert trio.handler.swims[-1][1] == ping  # the maker's, as it made it
    assert trio.relay.sessions.forwarded_bytes > 0


async def test_a_relay_cannot_forge_alter_or_replay_a_forwarded_call(trio: Trio) -> None:
    """Frames written down the session as a relay would pass them on."""
    peer = trio.relay.sessions.get(UNDIALLABLE)
    assert peer is not None
    message = wire.swim_to_pb(SwimMessage(Kind.PING, trio.ids["other"], "o:1", 3), 1)
    maker = Forwarder(trio.tls["other"])
    honest = maker.frame(UNDIALLABLE, trio.relay_address, "Swim", message.SerializeToString())

    async def refusal(frame: wire.pb.SessionFrame) -> tuple[grpc.StatusCode, str]:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await peer.unary("Swim", frame, 5)
        return info.value.code(), dict(info.value.trailing_metadata() or ())[REASON_KEY]

    # Altered on the way: the signature no longer holds, and only the relay could have.
    altered = wire.pb.SessionFrame()
    altered.CopyFrom(honest)
    altered.message = wire.swim_to_pb(
        SwimMessage(Kind.PING, trio.ids["other"], "o:1", 4), 1
    ).SerializeToString()
    assert await refusal(altered) == (grpc.StatusCode.PERMISSION_DENIED, "identity")
    assert [f[0] for f in trio.faults] == [trio.relay_address]
    # Signed by the relay itself, in the other member's name: the message's sender is not the
    # certificate's (the relay's own call, so refused and not held against it as a relay).
    own = Forwarder(trio.tls["relay"]).frame(
        UNDIALLABLE, trio.relay_address, "Swim", message.SerializeToString()
    )
    assert (await refusal(own))[1] == "identity"
    # Sent through another relay and passed on by this one: refused, and not its fault (it
    # cannot know which relay the maker named).
    elsewhere = maker.frame(UNDIALLABLE, "elsewhere:1", "Swim", message.SerializeToString())
    assert (await refusal(elsewhere))[1] == "malformed"
    assert len(trio.faults) == 1
    assert len(trio.handler.swims) == 0
    # As signed, it goes through, and the answer is the node's, signed for this call.
    answer = await peer.unary("Swim", honest, 5)
    assert answer.has_message
    assert maker.answer_signer(UNDIALLABLE, trio.relay_address, honest, answer) == (
        trio.tls["behind"].cert_pem
    )
    assert len(trio.handler.swims) == 1
    # Passed on again: refused as stale, and held against the relay.
    assert await refusal(honest) == (grpc.StatusCode.FAILED_PRECONDITION, "stale")
    assert len(trio.handler.swims) == 1
    assert [f[0] for f in trio.faults] == [trio.relay_address] * 2


async def test_an_honest_relay_refuses_a_replay_so_that_no_maker_can_frame_it(
    trio: Trio,
) -> None:
    """A maker that sends one call twice through an honest relay is refused by the relay; the
    node never sees the copy, so it never blames the relay."""
    message = wire.swim_to_pb(SwimMessage(Kind.PING, trio.ids["other"], "o:1", 3), 1)
    frame = Forwarder(trio.tls["other"]).frame(
        UNDIALLABLE, trio.relay_address, "Swim", message.SerializeToString()
    )
    stub = trio.other._stub(trio.relay_address, "control")
    request = wire.pb.ForwardRequest(to=UNDIALLABLE, call=frame)
    assert (await stub.Forward(request, timeout=5)).has_message
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Forward(request, timeout=5)
    assert dict(info.value.trailing_metadata() or ())[REASON_KEY] == "stale"
    assert len(trio.handler.swims) == 1
    assert trio.faults == []


async def test_a_node_probes_its_relay_through_itself(trio: Trio) -> None:
    await trio.behind.probe_relay(trio.relay_address, UNDIALLABLE, 5)
    # Nobody else can probe through the relay in the node's name.
    with pytest.raises(Rejected) as info:
        await trio.other.probe_relay(trio.relay_address, UNDIALLABLE, 5)
    assert info.value.reason is Reason.IDENTITY
    assert trio.faults == []


async def test_a_second_node_cannot_take_over_the_session_address(trio: Trio) -> None:
    with pytest.raises(Rejected) as info:
        await trio.other.hold_session(trio.relay_address, UNDIALLABLE)
    assert info.value.reason is Reason.BAD_ADDRESS
    assert trio.relay.sessions.held_by(UNDIALLABLE, trio.ids["behind"])
