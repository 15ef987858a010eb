"""A relay that drops, delays, replays or alters what it passes on, or makes up answers, is
found out and named no more (node/daemon/dialout.py, node/transport/forwarding.py), and the
node's members reach it through its other relay all along. Real gRPC over mutual TLS: the node
behind "NAT" holds sessions to two relays, and one of them misbehaves in one way per test."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc.aio
import pytest

from gossip.relays import relay_order
from gossip.swim import Kind, SwimMessage
from node.daemon.dialout import DialOut
from node.runtime import Runtime
from node.security.pki import TlsFiles, init_ca, issue_node, node_id_of_cert
from node.transport import wire
from node.transport.base import Route
from node.transport.forwarding import PROBE, answer_claim
from node.transport.grpc import GrpcTransport, GrpcTransportConfig
from node.transport.session import TunnelPeer, sign
from tests.node.helpers import poll
from tests.node.test_tls import files
from tests.node.test_transport_contract import UNDIALLABLE, RecordingHandler

FAULTS = ("drop", "delay", "replay", "alter", "make_up")
#: Probes every PROBE_S, each given PROBE_TIMEOUT_S to come back (a "delay" relay holds calls
#: back for twice that).
PROBE_S = 0.2
PROBE_TIMEOUT_S = 1.0
TIMEOUT_S = 20.0


class Misbehaving:
    """A relay's end of a session that passes calls on wrongly, in one way."""

    def __init__(self, peer: TunnelPeer, fault: str, tls: TlsFiles) -> None:
        self._peer = peer
        self._fault = fault
        self._tls = tls
        self.passed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._peer, name)

    async def unary(self, method: str, request: Any, timeout_s: float | None) -> Any:
        self.passed += 1
        if self._fault == "drop":
            await asyncio.Event().wait()  # never passed on, never answered
        if self._fault == "delay":
            await asyncio.sleep(2 * PROBE_TIMEOUT_S)
        if self._fault == "alter":
            altered = wire.pb.SessionFrame()
            altered.CopyFrom(request)
            altered.message = bytes(request.message)[:-1] + bytes([request.message[-1] ^ 1])
            request = altered
        if self._fault == "make_up":  # an answer of its own, signed by itself
            message = (
                bytes(request.message)
                if method == PROBE
                else wire.pb.SwimReply(node_id="x" * 32).SerializeToString()
            )
            frame = wire.pb.SessionFrame(message=message, has_message=True, end=True)
            frame.origin_certificate = self._tls.cert_pem
            claim = answer_claim(self._peer.address, request.via, request.origin_seq, message)
            frame.origin_signature = sign(self._tls.key_pem, claim)
            return frame
        answer = await self._peer.unary(method, request, timeout_s)
        if self._fault == "replay":
            with contextlib.suppress(grpc.aio.AioRpcError):  # refused: stale
                await self._peer.unary(method, request, timeout_s)
        return answer


@dataclass
class Relayed:
    behind: GrpcTransport
    handler: RecordingHandler
    dialout: DialOut
    relays: list[GrpcTransport]
    addresses: list[str]
    other: GrpcTransport
    behind_id: str
    tls: dict[str, TlsFiles]
    named: list[tuple[str, ...]]


@pytest.fixture
async def relayed(tmp_path: Path) -> AsyncIterator[Relayed]:
    init_ca(tmp_path / "ca")
    tls = {}
    for name in ("behind", "bad", "good", "other"):
        issue_node(tmp_path / "ca", tmp_path / name, name)
        tls[name] = files(tmp_path / name)
    behind, bad, good, other = (GrpcTransport(GrpcTransportConfig(tls=tls[n])) for n in tls)
    handler = RecordingHandler()
    await behind.serve(handler, "127.0.0.1:0")
    addresses = [await t.serve(RecordingHandler(), "127.0.0.1:0") for t in (bad, good)]
    await other.serve(RecordingHandler(), "127.0.0.1:0")
    named: list[tuple[str, ...]] = []
    dialout = DialOut(
        behind,
        Runtime.on_loop(),
        lambda: UNDIALLABLE,
        named.append,
        probe_every_s=PROBE_S,
        probe_timeout_s=PROBE_TIMEOUT_S,
    )
    dialout.active = True
    for address in addresses:
        assert await dialout.open(address, 10)
    assert dialout.relays == tuple(sorted(addresses))
    behind_id = node_id_of_cert(tls["behind"].cert_pem)
    other.set_routes({UNDIALLABLE: Route(behind_id, tuple(addresses))})
    # The other member tries the bad relay first (its own order of the node's relays).
    other._relay_salt = next(
        salt
        for salt in (bytes([k]) for k in range(256))
        if relay_order(addresses, UNDIALLABLE, None, salt)[0] == addresses[0]
    )
    named.clear()
    yield Relayed(
        behind,
        handler,
        dialout,
        [bad, good],
        addresses,
        other,
        behind_id,
        tls,
        named,
    )
    await dialout.stop()
    for transport in (other, good, bad, behind):
        await transport.close(0)


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_misbehaving_relay_is_named_no_more_and_members_reach_the_node_all_along(
    relayed: Relayed, fault: str
) -> None:
    bad, good = relayed.addresses
    peer = relayed.relays[0].sessions.get(UNDIALLABLE)
    assert peer is not None
    misbehaving: Any = Misbehaving(peer, fault, relayed.tls["bad"])
    relayed.relays[0].sessions.get = lambda address: misbehaving  # type: ignore[method-assign]
    ping = SwimMessage(Kind.PING, node_id_of_cert(relayed.tls["other"].cert_pem), "o:1", 1)

    # A member reaches the node past the bad relay, and is not fooled by it.
    assert await relayed.other.call_swim(UNDIALLABLE, ping, 2 * PROBE_TIMEOUT_S)
    taken = [m for _, m in relayed.handler.swims]
    assert ping in taken
    if fault == "replay":
        assert taken == [ping]  # passed on honestly, then again: refused

    # The node finds the bad relay out and names only the good one.
    async def named_good_only() -> bool:
        return relayed.dialout.relays == (good,)

    await poll(named_good_only, "the node to name the good relay only", TIMEOUT_S)
    assert relayed.named[-1] == (good,)
    assert bad in relayed.dialout.distrusted
    assert relayed.dialout.faults >= 1
    assert misbehaving.passed >= 1
    # Both sessions stay up: only the naming changed.
    assert relayed.dialout.up == {bad, good}


async def test_honest_relays_stay_named(relayed: Relayed) -> None:
    """The node's probes come back through honest relays, and nothing is held against them."""

    async def probed() -> bool:
        return relayed.dialout.probes >= 10

    await poll(probed, "ten probes to come back", TIMEOUT_S)
    assert relayed.dialout.relays == tuple(sorted(relayed.addresses))
    assert relayed.dialout.faults == 0
    assert relayed.dialout.distrusted == {}
    assert relayed.named == []
