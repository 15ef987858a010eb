"""One contract, run against every transport: what a node can rely on, whatever carries it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace

import pytest
import torch

from gossip.codecs import get_codec
from gossip.digest import model_digest
from gossip.messages import (
    PROTOCOL_VERSION,
    Delta,
    Hello,
    ModelChunk,
    ParamSpec,
    SnapshotHeader,
    TaskFingerprint,
)
from gossip.swim import Kind, MemberRecord, Status, SwimMessage
from node.daemon.transfer import receive_model
from node.telemetry.status import NeighbourStatus, NodeStatus
from node.transport import wire, wire_sizes
from node.transport.base import (
    CHUNK_VALUES,
    ControlCaller,
    Reason,
    Rejected,
    SnapshotChunk,
    Transport,
    Unreachable,
    iter_chunks,
)
from node.transport.grpc import GrpcTransport, GrpcTransportConfig
from node.transport.memory import MemoryNetwork, MemoryTransport

FINGERPRINT = TaskFingerprint((ParamSpec("w", (3, 4), "float32"),), "int8", 64)
STATUS = NodeStatus(
    node_id="b" * 32,
    address="here:1",
    device="cpu",
    codec="int8",
    step=7,
    step_budget=10,
    training_done=False,
    train_loss=0.5,
    eval_accuracy=0.9,
    rounds=3,
    bytes_sent=100,
    bytes_sent_fp32=400,
    bytes_received=50,
    samples_per_s=12.5,
    samples=640,
    eval_loss=0.25,
    eval_step=5,
    eval_age_s=1.5,
    neighbours=(NeighbourStatus("c" * 32, "there:2", 4, 0.25, True, 10, 2, 1, 0.01, 0.25, 77),),
    members=(
        MemberRecord("b" * 32, "here:1", 7),
        MemberRecord("c" * 32, "there:2", 9, Status.SUSPECT),
    ),
    rejected={"gap": 2},
)


@dataclass
class RecordingHandler:
    """The receiving side, reduced to recording what arrives and refusing on command."""

    refuse_seq: dict[int, Reason] = field(default_factory=dict)
    deltas: list[Delta] = field(default_factory=list)
    snapshots: list[tuple[SnapshotHeader, torch.Tensor]] = field(default_factory=list)
    noted: list[Reason] = field(default_factory=list)
    swims: list[tuple[int, SwimMessage]] = field(default_factory=list)
    model: torch.Tensor = field(default_factory=lambda: torch.randn(2 * CHUNK_VALUES + 7))
    pulls: list[str] = field(default_factory=list)

    async def rpc_hello(self, hello: Hello) -> Hello:
        return Hello(
            PROTOCOL_VERSION, MemberRecord("b" * 32, "here:1", 7), FINGERPRINT, hello.members
        )

    async def rpc_swim(self, protocol_version: int, message: SwimMessage) -> str:
        if message.target == "refuse":
            raise Rejected(Reason.MALFORMED, "no swim for you")
        self.swims.append((protocol_version, message))
        return "b" * 32

    async def rpc_pull_model(
        self, protocol_version: int, requester: str, have: bytes = b""
    ) -> AsyncIterator[ModelChunk]:
        if requester == "stranger":
            raise Rejected(Reason.UNKNOWN_SENDER, "who are you?")
        self.pulls.append(requester)
        if have == model_digest(self.model):
            yield ModelChunk(self.model.numel(), 0, b"", step=11, same=True)
            return
        for chunk in iter_chunks(self.model):
            yield ModelChunk(self.model.numel(), chunk.offset, chunk.data, step=11)

    async def rpc_push_delta(self, delta: Delta) -> int:
        if delta.seq in self.refuse_seq:
            raise Rejected(self.refuse_seq[delta.seq], f"no to seq {delta.seq}")
        self.deltas.append(delta)
        return delta.seq

    async def rpc_push_snapshot(
        self, header: SnapshotHeader, chunks: AsyncIterator[SnapshotChunk]
    ) -> int:
        parts = [chunk async for chunk in chunks]
        if header.digest:  # named: one chunk of no values
            assert parts == [SnapshotChunk(0, b"")]
            self.snapshots.append((header, torch.empty(0)))
            return header.seq
        assert [p.offset for p in parts] == list(range(0, header.numel, CHUNK_VALUES))
        values = torch.cat(
            [torch.frombuffer(bytearray(p.data), dtype=torch.float32) for p in parts]
        )
        self.snapshots.append((header, values))
        return header.seq

    async def rpc_status(self) -> NodeStatus:
        return STATUS

    async def rpc_control(self, action: str, caller: ControlCaller) -> tuple[bool, str]:
        return action == "pause", ""

    def note_rejected(self, reason: Reason, detail: str) -> None:
        self.noted.append(reason)

    def is_revoked(self, node_id: str) -> bool:
        return False


Pair = tuple[Transport, Transport, str, RecordingHandler]
PairFactory = Callable[[], Awaitable[Pair]]


async def memory_pair() -> Pair:
    network = MemoryNetwork()
    server, client = MemoryTransport(network), MemoryTransport(network)
    handler = RecordingHandler()
    address = await server.serve(handler, "mem:0")
    await client.serve(RecordingHandler(), "mem:0")
    return server, client, address, handler


async def grpc_pair() -> Pair:
    server = GrpcTransport(GrpcTransportConfig(max_message_bytes=16 << 20))
    client = GrpcTransport(GrpcTransportConfig(max_message_bytes=16 << 20))
    handler = RecordingHandler()
    address = await server.serve(handler, "127.0.0.1:0")
    return server, client, address, handler


#: Where the node behind NAT says it is: nothing listens there, so only its session reaches it.
UNDIALLABLE = "127.0.0.1:1"


async def session_pair() -> Pair:
    """The handler's node cannot be dialled: it opened a dial-out session to the caller, and
    every call to it goes down that session (node/transport/session.py)."""
    behind = GrpcTransport(GrpcTransportConfig(max_message_bytes=16 << 20))
    member = GrpcTransport(GrpcTransportConfig(max_message_bytes=16 << 20))
    handler = RecordingHandler()
    await behind.serve(handler, "127.0.0.1:0")
    member_address = await member.serve(RecordingHandler(), "127.0.0.1:0")
    up = asyncio.Event()
    holding = asyncio.ensure_future(
        behind.hold_session(member_address, UNDIALLABLE, lambda _: up.set())
    )
    await asyncio.wait_for(up.wait(), 10)
    assert member.sessions.get(UNDIALLABLE) is not None
    _holding.add(holding)
    return behind, member, UNDIALLABLE, handler


_holding: set[asyncio.Future[None]] = set()


@pytest.fixture(params=[memory_pair, grpc_pair, session_pair], ids=["memory", "grpc", "session"])
async def pair(request: pytest.FixtureRequest) -> AsyncIterator[Pair]:
    server, client, address, handler = await request.param()
    yield server, client, address, handler
    await client.close(0)
    await server.close(0)
    for holding in _holding:
        holding.cancel()
    await asyncio.gather(*_holding, return_exceptions=True)
    _holding.clear()


def delta(seq: int, n: int = 500) -> Delta:
    payload = get_codec("int8", 64).encode(
        torch.randn(n, generator=torch.Generator().manual_seed(seq))
    )
    return Delta("a" * 32, session=42, seq=seq, step=seq * 3, payload=payload, degree=3)


async def test_hello_round_trips(pair: Pair) -> None:
    _, client, address, _ = pair
    members = (MemberRecord("a" * 32, "me:1", 3), MemberRecord("d" * 32, "x:9", 1, Status.LEFT))
    reply = await client.call_hello(
        address, Hello(PROTOCOL_VERSION, members[0], FINGERPRINT, members), 5
    )
    assert reply == Hello(
        PROTOCOL_VERSION, MemberRecord("b" * 32, "here:1", 7), FINGERPRINT, members
    )


async def test_a_delta_arrives_intact(pair: Pair) -> None:
    _, client, address, handler = pair
    sent = delta(1)
    assert await client.call_push_delta(address, sent, 5) == 1
    assert handler.deltas == [sent]


@pytest.mark.parametrize("reason", [r for r in Reason if r not in (Reason.NOT_READY,)])
async def test_a_refusal_comes_back_as_the_same_refusal(pair: Pair, reason: Reason) -> None:
    _, client, address, handler = pair
    handler.refuse_seq[5] = reason
    with pytest.raises(Rejected) as info:
        await client.call_push_delta(address, delta(5), 5)
    assert info.value.reason is reason
    assert info.value.detail == "no to seq 5"


async def test_a_snapshot_arrives_in_chunks_and_whole(pair: Pair) -> None:
    _, client, address, handler = pair
    values = torch.randn(2 * CHUNK_VALUES + 1234)
    header = SnapshotHeader("a" * 32, session=42, seq=9, numel=values.numel(), degree=5)
    assert await client.call_push_snapshot(address, header, values, 10) == 9
    [(got_header, got_values)] = handler.snapshots
    assert got_header == header
    assert torch.equal(got_values, values)


async def test_a_snapshot_named_by_its_digest_carries_the_name_and_no_values(pair: Pair) -> None:
    _, client, address, handler = pair
    values = torch.randn(2 * CHUNK_VALUES + 1234)
    named = SnapshotHeader("a" * 32, 42, 9, values.numel(), 5, digest=model_digest(values))
    assert await client.call_push_snapshot(address, named, values, 10) == 9
    [(got_header, got_values)] = handler.snapshots
    assert got_header == named
    assert got_values.numel() == 0
    assert (
        wire_sizes.snapshot_nbytes(named)
        < 200
        < wire_sizes.snapshot_nbytes(replace(named, digest=b""))
    )
    short = wire.snapshot_chunk_to_pb(replace(named, digest=b"short"), SnapshotChunk(0, b""))
    with pytest.raises(Rejected) as info:  # on the wire a digest is SHA-256's 32 bytes or none
        wire.snapshot_chunk_from_pb(short)
    assert info.value.reason is Reason.MALFORMED


async def test_a_pull_that_names_the_senders_model_gets_one_chunk_saying_so(pair: Pair) -> None:
    _, client, address, handler = pair
    have = model_digest(handler.model)
    chunks = [c async for c in client.call_pull_model(address, "a" * 32, 10, have)]
    assert chunks == [ModelChunk(handler.model.numel(), 0, b"", step=11, same=True)]
    own = handler.model.clone()
    got, step = await receive_model(_replay(chunks), own.numel(), "b", own)
    assert torch.equal(got, handler.model)
    assert step == 11
    other = [c async for c in client.call_pull_model(address, "a" * 32, 10, model_digest(own + 1))]
    assert len(other) == 3  # another model named: the values come
    with pytest.raises(Rejected) as info:  # "the same", to a puller that named nothing
        await receive_model(_replay(chunks), own.numel(), "b")
    assert info.value.reason is Reason.MALFORMED


async def _replay(chunks: list[ModelChunk]) -> AsyncIterator[ModelChunk]:
    for chunk in chunks:
        yield chunk


async def test_a_stream_delivers_in_order_and_acknowledges_each(pair: Pair) -> None:
    _, client, address, handler = pair
    stream = await client.open_delta_stream(address)
    for seq in range(1, 21):
        await stream.send(delta(seq))
    assert [await stream.next_ack() for _ in range(20)] == list(range(1, 21))
    assert [d.seq for d in handler.deltas] == list(range(1, 21))
    stream.cancel()


async def test_a_refusal_ends_the_stream(pair: Pair) -> None:
    _, client, address, handler = pair
    handler.refuse_seq[3] = Reason.GAP
    stream = await client.open_delta_stream(address)
    for seq in (1, 2, 3):
        await stream.send(delta(seq))
    assert await stream.next_ack() == 1
    assert await stream.next_ack() == 2
    with pytest.raises(Rejected) as info:
        await stream.next_ack()
    assert info.value.reason is Reason.GAP
    with pytest.raises((Rejected, Unreachable)):
        await stream.send(delta(4))
    assert [d.seq for d in handler.deltas] == [1, 2]


async def test_status_round_trips(pair: Pair) -> None:
    _, client, address, _ = pair
    assert await client.call_status(address, 5) == STATUS


async def test_nobody_listening_is_unreachable(pair: Pair) -> None:
    server, client, address, _ = pair
    await server.close(0)
    with pytest.raises(Unreachable):
        await client.call_push_delta(address, delta(1), 2)
    with pytest.raises(Unreachable):
        await client.call_status(address, 2)
    with pytest.raises(Unreachable):
        await client.call_swim(address, SwimMessage(Kind.PING, "a" * 32, "me:1", 1), 2)
    with pytest.raises(Unreachable):
        [c async for c in client.call_pull_model(address, "a" * 32, 2)]


async def test_a_node_back_at_its_address_is_reachable_at_once() -> None:
    """A restarted node (a device, a container) comes back where it was: the first call after
    it is back reaches it, however many failed while it was away. (gRPC only: in-memory calls
    have no connection that could remember the failures.)"""
    server, client, address, handler = await grpc_pair()
    ping = SwimMessage(Kind.PING, "a" * 32, "me:1", 1)
    try:
        await server.close(0)
        for _ in range(3):
            with pytest.raises(Unreachable):
                await client.call_swim(address, ping, 2)
        assert await server.serve(handler, address) == address
        assert await client.call_swim(address, ping, 2) == STATUS.node_id
        assert await client.call_status(address, 2) == STATUS
    finally:
        await client.close(0)
        await server.close(0)


async def test_a_membership_message_arrives_intact_and_names_who_took_it(pair: Pair) -> None:
    _, client, address, handler = pair
    message = SwimMessage(
        Kind.PING_REQ,
        "a" * 32,
        "me:1",
        seq=12,
        target="d" * 32,
        updates=(MemberRecord("a" * 32, "me:1", 3), MemberRecord("d" * 32, "x:9", 2, Status.DEAD)),
    )
    assert await client.call_swim(address, message, 5) == "b" * 32
    assert handler.swims == [(PROTOCOL_VERSION, message)]
    with pytest.raises(Rejected) as info:
        await client.call_swim(address, SwimMessage(Kind.PING, "a" * 32, "me:1", 1, "refuse"), 5)
    assert info.value.reason is Reason.MALFORMED


async def test_a_model_is_pulled_in_order_in_chunks(pair: Pair) -> None:
    _, client, address, handler = pair
    chunks = [c async for c in client.call_pull_model(address, "a" * 32, 10)]
    assert [c.offset for c in chunks] == list(range(0, handler.model.numel(), CHUNK_VALUES))
    assert {(c.numel, c.step) for c in chunks} == {(handler.model.numel(), 11)}
    got = torch.cat([torch.frombuffer(bytearray(c.data), dtype=torch.float32) for c in chunks])
    assert torch.equal(got, handler.model)
    assert handler.pulls == ["a" * 32]
    with pytest.raises(Rejected) as info:
        [c async for c in client.call_pull_model(address, "stranger", 10)]
    assert info.value.reason is Reason.UNKNOWN_SENDER
