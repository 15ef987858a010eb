"""The wire module: every message survives protobuf both ways; malformed ones are refused."""

from __future__ import annotations

import hashlib
import json
import math

import pytest
import torch

from gossip.codecs import get_codec
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
from node.transport import wire, wire_sizes
from node.transport.base import CHUNK_VALUES, Reason, Rejected, SnapshotChunk, iter_chunks
from protos import murmur_pb2 as pb

FP = TaskFingerprint(
    (ParamSpec("a.weight", (4, 3), "float32"), ParamSpec("a.bias", (4,), "float32")), "int4", 64
)


def test_hello_round_trips() -> None:
    hello = Hello(
        PROTOCOL_VERSION,
        MemberRecord("a1", "h:1", 5),
        FP,
        tuple(MemberRecord("b2", f"h:{i + 2}", i, status) for i, status in enumerate(Status)),
    )
    assert (
        wire.hello_from_pb(pb.Hello.FromString(wire.hello_to_pb(hello).SerializeToString()))
        == hello
    )


@pytest.mark.parametrize("codec", ["fp32", "int8", "int4", "sign", "topk", "randk", "dct-topk"])
def test_delta_round_trips_and_its_size_is_counted_exactly(codec: str) -> None:
    payload = get_codec(codec, 64, 0.125).encode(torch.randn(1000))
    delta = Delta("a1", 2**62, 17, 400, payload, degree=6)
    raw = wire.delta_to_pb(delta).SerializeToString()
    assert wire.delta_from_pb(pb.Delta.FromString(raw)) == delta
    assert wire_sizes.delta_nbytes(delta) == len(raw)
    assert wire_sizes.delta_fp32_nbytes(delta) - len(raw) == 4000 - payload.nbytes


def test_a_sparse_codecs_fraction_travels_in_the_fingerprint() -> None:
    fp = TaskFingerprint.of(FP.params, get_codec("topk", 256, 0.01))
    assert (fp.codec, fp.block_size, fp.fraction) == ("topk", 256, 0.01)
    raw = wire.fingerprint_to_pb(fp).SerializeToString()
    assert wire.fingerprint_from_pb(pb.TaskFingerprint.FromString(raw)) == fp
    other = TaskFingerprint.of(FP.params, get_codec("topk", 256, 0.02))
    assert fp.differences(other) == ["compression fraction: we have 0.01, they have 0.02"]
    assert fp.digest() != other.digest()
    # A dense codec has no fraction, whatever the setting: nodes agree, digests stay as before.
    dense = TaskFingerprint.of(FP.params, get_codec("int4", 64, 0.3))
    assert dense == FP
    old = [[[p.name, list(p.shape), p.dtype] for p in FP.params], "int4", 64]
    assert dense.digest() == hashlib.sha256(json.dumps(old).encode()).hexdigest()[:16]


@pytest.mark.parametrize("fraction", [math.nan, -0.5, 1.5, math.inf])
def test_a_fingerprint_with_a_fraction_out_of_range_is_refused(fraction: float) -> None:
    message = pb.TaskFingerprint(codec="topk", block_size=256, fraction=fraction)
    with pytest.raises(Rejected) as info:
        wire.fingerprint_from_pb(message)
    assert info.value.reason is Reason.MALFORMED


def test_snapshot_size_is_counted_without_building_the_chunks() -> None:
    values = torch.randn(2 * CHUNK_VALUES + 5)
    header = SnapshotHeader("a1", 3, 9, values.numel(), degree=4)
    real = sum(wire.snapshot_chunk_to_pb(header, c).ByteSize() for c in iter_chunks(values))
    assert wire_sizes.snapshot_nbytes(header) == real
    first = wire.snapshot_chunk_from_pb(wire.snapshot_chunk_to_pb(header, SnapshotChunk(0, b"x")))
    assert first == (header, SnapshotChunk(0, b"x"))


def test_a_pulled_model_and_a_membership_message_are_counted_exactly() -> None:
    values = torch.randn(2 * CHUNK_VALUES + 5)
    n = values.numel()
    chunks = [ModelChunk(n, c.offset, c.data, 2**40) for c in iter_chunks(values)]
    assert wire_sizes.model_nbytes(n, 2**40) == sum(
        wire.model_chunk_to_pb(c).ByteSize() for c in chunks
    )
    same = wire.model_chunk_to_pb(ModelChunk(n, 0, b"", 2**40, same=True))
    assert wire_sizes.same_model_nbytes(n, 2**40) == same.ByteSize() < 32
    message = SwimMessage(Kind.PING, "a1", "h:1", 4, updates=(MemberRecord("b2", "h:2", 1),))
    raw = wire.swim_to_pb(message, PROTOCOL_VERSION).SerializeToString()
    assert wire_sizes.swim_nbytes(message, PROTOCOL_VERSION) == len(raw)


@pytest.mark.parametrize(
    "message",
    [
        pb.Hello(protocol_version=1),
        pb.Hello(self=pb.Member(node_id="a", address="h:1")),
        pb.Hello(self=pb.Member(node_id="a b", address="h:1"), fingerprint=pb.TaskFingerprint()),
        pb.Hello(self=pb.Member(node_id="a", address=""), fingerprint=pb.TaskFingerprint()),
        pb.Hello(
            self=pb.Member(node_id="a", address="h:1"),
            fingerprint=pb.TaskFingerprint(params=[pb.ParamSpec(name="w", shape=[-1])]),
        ),
    ],
)
def test_malformed_hellos_are_refused(message: pb.Hello) -> None:
    with pytest.raises(Rejected) as info:
        wire.hello_from_pb(message)
    assert info.value.reason is Reason.MALFORMED


def test_malformed_deltas_are_refused() -> None:
    for message in (pb.Delta(sender="a"), pb.Delta(sender="", payload=pb.EncodedTensor())):
        with pytest.raises(Rejected) as info:
            wire.delta_from_pb(message)
        assert info.value.reason is Reason.MALFORMED


@pytest.mark.parametrize("kind", list(Kind))
def test_membership_messages_round_trip(kind: Kind) -> None:
    updates = (
        MemberRecord("a1", "h:1", 2),
        MemberRecord("c3", "[::1]:7", 9, Status.SUSPECT, accuser="a1", accuser_signature=b"s"),
        MemberRecord("d4", "h:4", 3, paused=True),
        MemberRecord("e5", "h:5", 1, region="eu-west.2"),
    )
    message = SwimMessage(kind, "a1", "h:1", 44, "c3" if kind is Kind.PING_REQ else "", updates)
    raw = wire.swim_to_pb(message, PROTOCOL_VERSION).SerializeToString()
    assert wire.swim_from_pb(pb.SwimMessage.FromString(raw)) == (PROTOCOL_VERSION, message)


@pytest.mark.parametrize(
    "message",
    [
        pb.SwimMessage(sender="a1", sender_address="h:1", kind=7),  # type: ignore[arg-type]
        pb.SwimMessage(sender="", sender_address="h:1"),
        pb.SwimMessage(sender="a1", sender_address="h"),
        pb.SwimMessage(sender="a1", sender_address="h:1", target="x y"),
        pb.SwimMessage(
            sender="a1",
            sender_address="h:1",
            updates=[pb.Member(node_id="b", address="h:2", status=9)],  # type: ignore[arg-type]
        ),
        pb.SwimMessage(
            sender="a1", sender_address="h:1", updates=[pb.Member(node_id="b", address="h:0")]
        ),
        pb.SwimMessage(
            sender="a1",
            sender_address="h:1",
            updates=[pb.Member(node_id="b", address="h:2", status=pb.DEAD, accuser="x y")],
        ),
        pb.SwimMessage(
            sender="a1",
            sender_address="h:1",
            updates=[pb.Member(node_id="b", address="h:2", accuser_signature=b"s" * 513)],
        ),
        *(
            pb.SwimMessage(
                sender="a1",
                sender_address="h:1",
                updates=[pb.Member(node_id="b", address="h:2", region=name)],
            )
            for name in ("a|paused", "-x", "x" * 64, "eu west", "é")
        ),
    ],
)
def test_malformed_membership_messages_are_refused(message: pb.SwimMessage) -> None:
    with pytest.raises(Rejected) as info:
        wire.swim_from_pb(message)
    assert info.value.reason is Reason.MALFORMED


def test_a_push_pull_carries_a_full_state_where_a_ping_is_bounded() -> None:
    records = tuple(MemberRecord(f"m{i}", f"h:{i + 1}", 1) for i in range(512))
    for kind in (Kind.PUSH_PULL, Kind.PUSH_PULL_REPLY):
        message = SwimMessage(kind, "a1", "h:1", 3, "", records)
        raw = wire.swim_to_pb(message, PROTOCOL_VERSION).SerializeToString()
        assert wire.swim_from_pb(pb.SwimMessage.FromString(raw))[1].updates == records
    ping = SwimMessage(Kind.PING, "a1", "h:1", 3, "", records[: wire.MAX_SWIM_UPDATES + 1])
    with pytest.raises(Rejected) as info:
        wire.swim_from_pb(pb.SwimMessage.FromString(wire.swim_to_pb(ping, 1).SerializeToString()))
    assert info.value.reason is Reason.MALFORMED


def test_model_chunks_round_trip() -> None:
    chunk = ModelChunk(numel=10, offset=4, data=b"\0" * 24, step=3)
    raw = wire.model_chunk_to_pb(chunk).SerializeToString()
    assert wire.model_chunk_from_pb(pb.ModelChunk.FromString(raw)) == chunk


def test_a_pause_is_part_of_the_members_own_claim() -> None:
    running = MemberRecord("a1", "h:1", 2)
    paused = MemberRecord("a1", "h:1", 2, paused=True)
    assert running.claim() == b"murmur-member|a1|h:1|2|alive"  # as it always signed
    assert paused.claim() == b"murmur-member|a1|h:1|2|alive|paused"  # a relay cannot forge it


def test_a_region_is_part_of_the_members_own_claim() -> None:
    plain = MemberRecord("a1", "h:1", 2)
    placed = MemberRecord("a1", "h:1", 2, region="r0")
    assert plain.claim() == b"murmur-member|a1|h:1|2|alive"  # as it always signed
    assert placed.claim() == b"murmur-member|a1|h:1|2|alive|region=r0"  # nobody else can move it
