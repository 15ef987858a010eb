"""Bad input against a live node over real gRPC: a clear status, counted, and nothing changes."""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
import pytest
import torch

from gossip.clock import ManualClock
from gossip.codecs import get_codec, tensor_to_bytes
from gossip.messages import PROTOCOL_VERSION, Delta, Hello
from gossip.swim import Kind, MemberRecord, Status, SwimMessage
from node.daemon.node import Node
from node.security.penalties import RateConfig, RateLimiter
from node.transport import wire
from protos import murmur_pb2 as pb
from protos import murmur_pb2_grpc as pb_grpc
from tests.node.helpers import SwimResponder, config, fixed_identity, signed_record

PEER_IDENTITY = fixed_identity(1)
PEER = PEER_IDENTITY.node_id
SESSION = 77


@dataclass
class Target:
    node: Node
    stub: pb_grpc.MurmurStub
    numel: int
    peer: SwimResponder

    def frozen(self) -> tuple[bytes, int, bytes]:
        """Everything a bad message must not change: the replica, its seq, the model."""
        replica = self.node.state.replicas[PEER]
        return tensor_to_bytes(replica.value), replica.seq, tensor_to_bytes(self.node.flat.flat)

    async def rejected(self) -> dict[str, int]:
        return dict((await self.stub.Status(pb.StatusRequest())).rejected)


def good_delta(numel: int, seq: int) -> pb.Delta:
    x = torch.randn(numel, generator=torch.Generator().manual_seed(seq)) * 1e-3
    return wire.delta_to_pb(Delta(PEER, SESSION, seq, seq, get_codec("int8", 256).encode(x)))


@pytest.fixture
async def target(tmp_path: Path) -> AsyncIterator[Target]:
    # Waits for a third member that never comes: it serves, but neither trains nor gossips.
    node = await Node.create(config(tmp_path, wait_members=3, wait_timeout_s=None))
    await node.start()
    channel = grpc.aio.insecure_channel(node.address)
    stub = pb_grpc.MurmurStub(channel)  # type: ignore[no-untyped-call]
    # Introduce a peer (one that answers the membership protocol) and give the node its replica.
    peer = SwimResponder(PEER_IDENTITY)
    peer_address = await peer.start()
    assert peer.swim is not None
    assert peer.swim.address == peer_address
    hello = Hello(PROTOCOL_VERSION, peer.swim.me, node.fingerprint, ())  # signed by the peer
    await stub.Hello(wire.hello_to_pb(hello))
    numel = node.flat.numel
    values = torch.randn(numel, generator=torch.Generator().manual_seed(0))
    chunk = pb.SnapshotChunk(
        protocol_version=PROTOCOL_VERSION,
        sender=PEER,
        session=SESSION,
        seq=0,
        numel=numel,
        offset=0,
        data=tensor_to_bytes(values),
    )
    await stub.PushSnapshot(iter([chunk]))
    assert (await stub.PushDelta(good_delta(numel, 1))).replica_seq == 1
    yield Target(node, stub, numel, peer)
    await channel.close()
    await node.stop(grace_s=0)
    await peer.stop()


def _with(d: pb.Delta, **fields: object) -> pb.Delta:
    """A copy of ``d`` with some fields changed (``payload_*`` ones inside the payload)."""
    out = pb.Delta()
    out.CopyFrom(d)
    for name, value in fields.items():
        if name.startswith("payload_"):
            setattr(out.payload, name.removeprefix("payload_"), value)
        else:
            setattr(out, name, value)
    return out


def wrong_length(d: pb.Delta) -> pb.Delta:
    return _with(d, payload_numel=d.payload.numel - 1)


def wrong_dtype(d: pb.Delta) -> pb.Delta:
    return _with(d, payload_codec="fp16")


def wrong_block_count(d: pb.Delta) -> pb.Delta:
    return _with(d, payload_scales=d.payload.scales[:-4])


def wrong_block_size(d: pb.Delta) -> pb.Delta:
    return _with(d, payload_block_size=128)


def non_finite(d: pb.Delta) -> pb.Delta:
    return _with(d, payload_scales=struct.pack("<f", math.nan) + d.payload.scales[4:])


def maximal(d: pb.Delta) -> pb.Delta:
    """Every value as large as int8 codes with a huge (finite) scale make it: no overflow, but a
    replica moved absurdly far."""
    blocks = len(d.payload.scales) // 4
    return _with(
        d,
        payload_scales=struct.pack("<f", 1e30) * blocks,
        payload_data=b"\x7f" * len(d.payload.data),
    )


def unknown_sender(d: pb.Delta) -> pb.Delta:
    return _with(d, sender="e" * 32)


def seq_from_the_future(d: pb.Delta) -> pb.Delta:
    return _with(d, seq=9)


def replayed(d: pb.Delta) -> pb.Delta:
    return _with(d, seq=1)


def other_protocol(d: pb.Delta) -> pb.Delta:
    return _with(d, protocol_version=99)


def no_payload(d: pb.Delta) -> pb.Delta:
    out = _with(d)
    out.ClearField("payload")
    return out


def bad_sender_id(d: pb.Delta) -> pb.Delta:
    return _with(d, sender="not an id!")


INVALID, PRECONDITION = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION
CASES: list[tuple[Callable[[pb.Delta], pb.Delta], grpc.StatusCode, str]] = [
    (wrong_length, INVALID, "bad_payload"),
    (wrong_dtype, INVALID, "bad_payload"),
    (wrong_block_count, INVALID, "bad_payload"),
    (wrong_block_size, INVALID, "bad_payload"),
    (non_finite, INVALID, "non_finite"),
    (maximal, PRECONDITION, "implausible"),
    (no_payload, INVALID, "malformed"),
    (bad_sender_id, INVALID, "malformed"),
    (unknown_sender, PRECONDITION, "unknown_sender"),
    (seq_from_the_future, PRECONDITION, "gap"),
    (replayed, PRECONDITION, "stale"),
    (other_protocol, PRECONDITION, "protocol_version"),
]


@pytest.mark.parametrize(("corrupt", "code", "reason"), CASES, ids=[c[0].__name__ for c in CASES])
async def test_a_bad_delta_gets_a_clear_status_is_counted_and_changes_nothing(
    target: Target,
    corrupt: Callable[[pb.Delta], pb.Delta],
    code: grpc.StatusCode,
    reason: str,
) -> None:
    before = target.frozen()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await target.stub.PushDelta(corrupt(good_delta(target.numel, 2)))
    assert info.value.code() == code
    assert str(info.value.details()).startswith(f"{reason}:")
    assert await target.rejected() == {reason: 1}
    assert target.frozen() == before
    # The node still serves, and the good delta still applies.
    assert (await target.stub.PushDelta(good_delta(target.numel, 2))).replica_seq == 2


async def test_a_bad_delta_ends_a_stream_with_its_status(target: Target) -> None:
    call = target.stub.StreamDeltas()
    await call.write(good_delta(target.numel, 2))
    assert (await call.read()).replica_seq == 2
    before = target.frozen()
    await call.write(non_finite(good_delta(target.numel, 3)))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == INVALID
    assert target.frozen() == before
    assert await target.rejected() == {"non_finite": 1}


async def test_a_snapshot_with_chunks_out_of_place_is_refused(target: Target) -> None:
    before = target.frozen()
    half = target.numel // 2
    values = torch.zeros(target.numel)

    def chunk(offset: int, data: torch.Tensor) -> pb.SnapshotChunk:
        return pb.SnapshotChunk(
            protocol_version=PROTOCOL_VERSION,
            sender=PEER,
            session=SESSION,
            seq=5,
            numel=target.numel,
            offset=offset,
            data=tensor_to_bytes(data),
        )

    cases = {
        "gap": [chunk(0, values[:half]), chunk(half + 1, values[half + 1 :])],
        "short": [chunk(0, values[:half])],
        "long": [chunk(0, values), chunk(target.numel, values[:1])],
    }
    for name, chunks in cases.items():
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await target.stub.PushSnapshot(iter(chunks))
        assert info.value.code() == INVALID, name
    assert await target.rejected() == {"malformed": 3}
    assert target.frozen() == before


async def test_a_hello_for_another_task_is_refused_with_what_differs(target: Target) -> None:
    other = Hello(
        PROTOCOL_VERSION,
        MemberRecord("d" * 32, "127.0.0.1:9", 1),
        type(target.node.fingerprint)(target.node.fingerprint.params[:-1], "int4", 256),
        (),
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await target.stub.Hello(wire.hello_to_pb(other))
    assert info.value.code() == PRECONDITION
    details = str(info.value.details())
    assert "codec: we have auto, you have int4" in details
    assert "parameter 2.bias: we have it, you have nothing" in details
    assert len(target.node.peers.view) == 2


async def test_a_message_larger_than_a_whole_fp32_model_is_refused_by_size(target: Target) -> None:
    huge = _with(good_delta(target.numel, 2), payload_data=b"\0" * (8 * target.numel + (2 << 20)))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await target.stub.PushDelta(huge)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def members(node: Node) -> list[MemberRecord]:
    return node.peers.swim.records()


@pytest.mark.parametrize(
    ("address", "code", "reason", "words"),
    [
        ("no-port-here", INVALID, "malformed", "is not host:port"),
        ("127.0.0.1:99999", INVALID, "malformed", "is not host:port"),
        # The same answer whatever went wrong at the address: no port scanning through a node.
        ("127.0.0.1:9", INVALID, "bad_address", "nobody answers as"),
        ("PEER", INVALID, "bad_address", "nobody answers as"),
    ],
)
async def test_a_join_from_an_address_that_is_wrong_or_silent_changes_no_view(
    target: Target, address: str, code: grpc.StatusCode, reason: str, words: str
) -> None:
    if address == "PEER":  # a real member answers there, under another id
        address = target.peer.swim.address if target.peer.swim else ""
    before = members(target.node)
    joiner = signed_record(fixed_identity(2), address)
    hello = wire.hello_to_pb(Hello(PROTOCOL_VERSION, joiner, target.node.fingerprint, ()))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await target.stub.Hello(hello)
    assert info.value.code() == code
    assert words in str(info.value.details())
    for leak in ("UNAVAILABLE", "refused", "DEADLINE", PEER[:8]):  # what the call-back met
        assert leak not in str(info.value.details())
    assert members(target.node) == before
    assert (await target.rejected()).get(reason) == 1


async def test_a_join_in_another_protocol_version_changes_no_view(target: Target) -> None:
    before = members(target.node)
    hello = wire.hello_to_pb(
        Hello(99, MemberRecord("d" * 32, "127.0.0.1:9", 1), target.node.fingerprint, ())
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await target.stub.Hello(hello)
    assert info.value.code() == PRECONDITION
    assert "protocol version 99" in str(info.value.details())
    assert members(target.node) == before


async def test_a_joiner_whose_record_is_not_signed_by_its_key_is_refused(target: Target) -> None:
    before = members(target.node)
    honest = signed_record(fixed_identity(3), "127.0.0.1:9")
    impostors = [
        dataclasses.replace(honest, signature=b""),  # unsigned
        dataclasses.replace(honest, address="127.0.0.1:10"),  # moved after signing
        # Signed, but by another key than the one its id is the hash of.
        dataclasses.replace(honest, public_key=signed_record(fixed_identity(4), "x:1").public_key),
    ]
    for joiner in impostors:
        hello = wire.hello_to_pb(Hello(PROTOCOL_VERSION, joiner, target.node.fingerprint, ()))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await target.stub.Hello(hello)
        assert "not signed by the key of its node id" in str(info.value.details())
    assert members(target.node) == before
    assert (await target.rejected()).get("identity") == len(impostors)


async def test_a_relayed_record_with_a_bad_signature_is_dropped(target: Target) -> None:
    real = target.node.peers.swim.record(PEER)
    assert real is not None
    # A relay moves PEER to an address of its choosing, and says another member left.
    hijack = dataclasses.replace(real, address="10.6.6.6:7070", incarnation=real.incarnation + 1)
    departed = dataclasses.replace(real, status=Status.LEFT)
    relay = fixed_identity(5)
    message = SwimMessage(Kind.PING, relay.node_id, "127.0.0.1:9", 1, updates=(hijack, departed))
    await target.stub.Swim(wire.swim_to_pb(message, PROTOCOL_VERSION))
    assert target.node.peers.swim.record(PEER) == real
    assert target.node.peers.swim.forged == 2


async def test_a_sender_over_its_rate_is_refused_until_it_slows_down(target: Target) -> None:
    clock = ManualClock()
    target.node.service.rates = RateLimiter(RateConfig(rate=1.0, burst=3.0), clock)
    ping = wire.swim_to_pb(SwimMessage(Kind.PING, PEER, "127.0.0.1:9", 1), PROTOCOL_VERSION)
    for _ in range(3):
        await target.stub.Swim(ping)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await target.stub.Swim(ping)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (await target.rejected()).get("rate_limited") == 1
    clock.advance(1.0)  # one message's worth of tokens back
    await target.stub.Swim(ping)


async def test_bytes_that_are_no_message_at_all_get_a_clear_counted_refusal(
    target: Target,
) -> None:
    before = target.frozen()
    async with grpc.aio.insecure_channel(target.node.address) as channel:
        for method in ("PushDelta", "Swim", "Hello"):
            call = channel.unary_unary(
                f"/murmur.v1.Murmur/{method}",
                request_serializer=lambda raw: raw,
                response_deserializer=lambda raw: raw,
            )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(b"\xff\xff\xff\xff")  # a field tag with no end: not protobuf
            assert info.value.code() == INVALID, method
            assert "not a" in str(info.value.details())
    assert (await target.rejected()).get("malformed") == 3
    assert target.frozen() == before
