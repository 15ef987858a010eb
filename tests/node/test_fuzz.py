"""Fuzzing every RPC of a live node, and the back-off for peers that keep sending bad messages.

Two nodes are built alike: the target, which gets the fuzz, and a control, which gets only what
the target accepted. Afterwards the target still serves, its model and replicas equal the
control's to the bit, its memory has not run away, and its rejection counters grew.

The nodes run on an event loop in a thread of their own, so that the tests are plain functions
that Hypothesis can drive, talking to the nodes over blocking gRPC channels.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gossip.clock import ManualClock
from gossip.codecs import get_codec, tensor_to_bytes
from gossip.messages import PROTOCOL_VERSION, Delta, Hello
from node.daemon.node import Node
from node.security.penalties import Penalties, PenaltyConfig
from node.transport import wire
from node.transport.base import Reason
from protos import murmur_pb2 as pb
from tests.node.helpers import SwimResponder, config, fixed_identity

T = TypeVar("T")

PEER_IDENTITY = fixed_identity(11)
PEER = PEER_IDENTITY.node_id
SESSION = 77
METHOD = "/murmur.v1.Murmur/"
CALL_TIMEOUT_S = 10.0
#: Statuses a refusal may carry. UNKNOWN or INTERNAL would mean an exception the node did not
#: expect reached gRPC; they are allowed only for bytes that do not parse at all, which grpc.aio
#: refuses (as UNKNOWN) before any of the node's code runs.
REFUSALS = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
#: The fuzz must reach the checks behind the ban, so the target never bans (the ban has a test
#: of its own below); its clock still only moves when told.
NO_BANS = PenaltyConfig(threshold=1 << 30)


class Loop:
    """An event loop in a thread; ``run`` waits for a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10.0)
        self.loop.close()


@dataclass
class Live:
    node: Node
    peer: SwimResponder
    channel: grpc.Channel
    clock: ManualClock

    def call(self, method: str, request: bytes) -> bytes:
        unary: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self.channel.unary_unary(
            METHOD + method
        )
        return bytes(unary(request, timeout=CALL_TIMEOUT_S))

    def stream_in(self, method: str, requests: Sequence[bytes]) -> bytes:
        call: grpc.StreamUnaryMultiCallable[bytes, bytes] = self.channel.stream_unary(
            METHOD + method
        )
        return bytes(call(iter(requests), timeout=CALL_TIMEOUT_S))

    def stream_out(self, method: str, request: bytes) -> list[bytes]:
        call: grpc.UnaryStreamMultiCallable[bytes, bytes] = self.channel.unary_stream(
            METHOD + method
        )
        return [bytes(r) for r in call(request, timeout=CALL_TIMEOUT_S)]

    def status(self) -> pb.NodeStatus:
        return pb.NodeStatus.FromString(self.call("Status", b""))

    def rejected(self) -> dict[str, int]:
        return dict(self.status().rejected)

    def push_delta(self, delta: pb.Delta) -> int:
        return pb.DeltaAck.FromString(self.call("PushDelta", delta.SerializeToString())).replica_seq


@functools.cache
def _good_delta(numel: int, seq: int) -> bytes:
    x = torch.randn(numel, generator=torch.Generator().manual_seed(seq)) * 1e-3
    delta = Delta(PEER, SESSION, seq, seq, get_codec("int8", 256).encode(x))
    return wire.delta_to_pb(delta).SerializeToString()


def good_delta(numel: int, seq: int) -> pb.Delta:
    """The same bytes every time (the codec rounds stochastically), in a fresh message."""
    return pb.Delta.FromString(_good_delta(numel, seq))


def good_snapshot(numel: int, seq: int) -> pb.SnapshotChunk:
    values = torch.randn(numel, generator=torch.Generator().manual_seed(1000 + seq))
    return pb.SnapshotChunk(
        protocol_version=PROTOCOL_VERSION,
        sender=PEER,
        session=SESSION,
        seq=seq,
        numel=numel,
        offset=0,
        data=tensor_to_bytes(values),
    )


async def _start(tmp_path: Path, penalties: PenaltyConfig, clock: ManualClock) -> Live:
    # Waits for a third member that never comes: it serves, but neither trains nor gossips.
    node = await Node.create(config(tmp_path, wait_members=3, wait_timeout_s=None))
    node.service.penalties = Penalties(penalties, clock)
    await node.start()
    peer = SwimResponder(PEER_IDENTITY)
    await peer.start()
    assert peer.swim is not None
    channel = grpc.insecure_channel(node.address)
    return Live(node, peer, channel, clock)


def _introduce(live: Live) -> None:
    """The peer says hello and hands over its replica: a snapshot, then one delta."""
    assert live.peer.swim is not None
    hello = Hello(PROTOCOL_VERSION, live.peer.swim.me, live.node.fingerprint, ())
    live.call("Hello", wire.hello_to_pb(hello).SerializeToString())
    numel = live.node.flat.numel
    live.stream_in("PushSnapshot", [good_snapshot(numel, 0).SerializeToString()])
    assert live.push_delta(good_delta(numel, 1)) == 1


async def _stop(live: Live) -> None:
    await live.node.stop(grace_s=0)
    await live.peer.stop()


@pytest.fixture
def loop() -> Iterator[Loop]:
    loop = Loop()
    yield loop
    loop.close()


def start(loop: Loop, tmp_path: Path, penalties: PenaltyConfig = NO_BANS) -> Live:
    live = loop.run(_start(tmp_path, penalties, ManualClock()))
    _introduce(live)
    return live


@pytest.fixture
def pair(loop: Loop, tmp_path: Path) -> Iterator[tuple[Live, Live]]:
    started: list[Live] = []
    try:
        started.append(start(loop, tmp_path / "target"))
        started.append(start(loop, tmp_path / "control"))
        yield started[0], started[1]
    finally:
        for live in started:
            live.channel.close()
            loop.run(_stop(live))


# -- outcomes ---------------------------------------------------------------------------------


def refused_cleanly(err: grpc.RpcError, parses: bool) -> bool:
    """A refusal the node meant: a refusal status, with its reason first in the details."""
    code = err.code()
    if code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL) and not parses:
        return True  # grpc.aio could not decode the request; the node never saw it
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return True
    if code not in REFUSALS:
        return False
    return str(err.details()).split(":", 1)[0] in set(Reason)


def parses(message: type[Any], data: bytes) -> bool:
    try:
        message.FromString(data)
    except Exception:  # DecodeError, or any other complaint of the parser
        return False
    return True


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One to four byte-level edits: flip a bit, overwrite, insert, delete, truncate, duplicate."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        i = rng.randrange(len(out) + 1)
        if op == 0 and out and i < len(out):
            out[i] ^= 1 << rng.randrange(8)
        elif op == 1 and i < len(out):
            out[i] = rng.randrange(256)
        elif op == 2:
            out[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 3:
            del out[i : i + rng.randint(1, 16)]
        elif op == 4:
            del out[i:]
        else:
            out[i:i] = out[max(0, i - 16) : i]
    return bytes(out)


# -- strategies -------------------------------------------------------------------------------

U32, U64 = st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 64) - 1)
TEXT = st.text(max_size=40)
IDS = st.one_of(st.just(PEER), st.text("0123456789abcdef", min_size=1, max_size=40), TEXT)
ADDRESSES = st.one_of(TEXT, st.integers(0, 70000).map(lambda p: f"127.0.0.1:{p}"))


def members() -> st.SearchStrategy[pb.Member]:
    return st.builds(
        pb.Member,
        node_id=IDS,
        address=ADDRESSES,
        incarnation=U64,
        status=st.integers(0, 6),
        public_key=st.binary(max_size=100),
        signature=st.binary(max_size=100),
    )


def deltas(numel: int) -> st.SearchStrategy[pb.Delta]:
    blocks = -(-numel // 256)
    payload = st.builds(
        pb.EncodedTensor,
        codec=st.one_of(st.just("int8"), st.sampled_from(["fp16", "fp32", "int4"]), TEXT),
        numel=st.one_of(st.just(numel), U64),
        block_size=st.one_of(st.just(256), U32),
        scales=st.one_of(st.binary(min_size=4 * blocks, max_size=4 * blocks), st.binary()),
        data=st.one_of(st.binary(min_size=numel, max_size=numel), st.binary(max_size=64)),
    )
    return st.builds(
        pb.Delta,
        protocol_version=st.one_of(st.just(PROTOCOL_VERSION), U32),
        sender=IDS,
        seq=st.one_of(st.integers(0, 4), U64),
        step=U64,
        payload=st.one_of(st.none(), payload),
        session=st.one_of(st.just(SESSION), U64),
        degree=U32,
    )


def snapshot_chunks(numel: int) -> st.SearchStrategy[pb.SnapshotChunk]:
    return st.builds(
        pb.SnapshotChunk,
        protocol_version=st.one_of(st.just(PROTOCOL_VERSION), U32),
        sender=IDS,
        seq=st.one_of(st.integers(0, 4), U64),
        numel=st.one_of(st.just(numel), st.integers(0, 2 * numel), U64),
        offset=st.one_of(st.just(0), U64),
        data=st.one_of(st.binary(max_size=64), st.binary(min_size=4 * numel, max_size=4 * numel)),
        session=st.one_of(st.just(SESSION), U64),
        degree=U32,
    )


def swims() -> st.SearchStrategy[pb.SwimMessage]:
    return st.builds(
        pb.SwimMessage,
        protocol_version=st.one_of(st.just(PROTOCOL_VERSION), U32),
        kind=st.integers(0, 5),
        sender=IDS,
        sender_address=ADDRESSES,
        seq=U64,
        target=IDS,
        updates=st.lists(members(), max_size=4),
    )


def hellos(fingerprint: pb.TaskFingerprint) -> st.SearchStrategy[pb.Hello]:
    params = st.builds(
        pb.ParamSpec, name=TEXT, shape=st.lists(st.integers(0, 1 << 20), max_size=4), dtype=TEXT
    )
    fingerprints = st.one_of(
        st.just(fingerprint),
        st.builds(pb.TaskFingerprint, params=st.lists(params, max_size=3), codec=TEXT),
    )
    return st.builds(
        pb.Hello,
        protocol_version=st.one_of(st.just(PROTOCOL_VERSION), U32),
        self=st.one_of(st.none(), members()),
        fingerprint=st.one_of(st.none(), fingerprints),
        members=st.lists(members(), max_size=3),
    )


# -- the fuzz ---------------------------------------------------------------------------------


@dataclass
class Fuzz:
    target: Live
    control: Live
    accepted: int = 0  # messages the target took, and the control was then given

    def expect_refusal_or(self, message: type[Any], data: bytes, send: Callable[[], T]) -> T | None:
        try:
            return send()
        except grpc.RpcError as err:
            clean, why = refused_cleanly(err, parses(message, data)), (err.code(), err.details())
        assert clean, why
        return None

    def unary(self, method: str, message: type[Any], data: bytes) -> None:
        self.expect_refusal_or(message, data, lambda: self.target.call(method, data))

    def delta(self, data: bytes) -> None:
        answer = self.expect_refusal_or(pb.Delta, data, lambda: self.target.call("PushDelta", data))
        if answer is not None:  # a delta that was good after all: the control takes it too
            self.accepted += 1
            assert self.control.call("PushDelta", data) == answer

    def stream(self, chunks: list[bytes]) -> None:
        acks: list[bytes] = []

        def send() -> None:
            # Acks as they come, so that those before a refusal are kept.
            call: grpc.StreamStreamMultiCallable[bytes, bytes] = self.target.channel.stream_stream(
                METHOD + "StreamDeltas"
            )
            for ack in call(iter(chunks), timeout=CALL_TIMEOUT_S):
                acks.append(bytes(ack))

        self.expect_refusal_or(pb.Delta, b"".join(chunks), send)
        if not all(parses(pb.Delta, c) for c in chunks):
            assert not acks or len(acks) < len(chunks)
        for data, ack in zip(chunks, acks, strict=False):
            self.accepted += 1
            assert self.control.call("PushDelta", data) == ack

    def snapshot(self, chunks: list[bytes]) -> None:
        answer = self.expect_refusal_or(
            pb.SnapshotChunk,
            b"".join(chunks),
            lambda: self.target.stream_in("PushSnapshot", chunks),
        )
        if answer is not None:
            self.accepted += 1
            assert self.control.stream_in("PushSnapshot", chunks) == answer

    def pull(self, data: bytes) -> None:
        self.expect_refusal_or(
            pb.PullModelRequest, data, lambda: self.target.stream_out("PullModel", data)
        )


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


#: Examples per RPC for the Hypothesis part; mutations per RPC for the byte-level part.
EXAMPLES, MUTATIONS = 80, 150
#: Each message is at most a few MB (the whole digits model is far smaller) and nothing of a
#: refused one may be kept; 200 MB is room for allocator noise and gRPC's buffers, yet far below
#: what keeping even one copy of every fuzzed message would take.
RSS_GROWTH_LIMIT = 200 << 20


# The nodes' own threads use the ``random`` module while Hypothesis draws, which it takes for a
# strategy that uses ``random``; the draws here do not.
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
def test_a_fuzzed_node_keeps_serving_and_its_model_and_replicas_equal_the_controls(
    pair: tuple[Live, Live],
) -> None:
    target, control = pair
    fuzz = Fuzz(target, control)
    numel = target.node.flat.numel
    fingerprint = wire.fingerprint_to_pb(target.node.fingerprint)
    own = target.node.node_id
    target.status()  # warm the channel before measuring memory
    rejected_before = sum(target.rejected().values())
    rss_before = rss_bytes()
    few = settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )

    @few
    @given(deltas(numel))
    def push_delta(d: pb.Delta) -> None:
        fuzz.delta(d.SerializeToString())

    @few
    @given(st.lists(deltas(numel), min_size=1, max_size=3))
    def stream_deltas(ds: list[pb.Delta]) -> None:
        fuzz.stream([d.SerializeToString() for d in ds])

    @few
    @given(st.lists(snapshot_chunks(numel), min_size=0, max_size=3))
    def push_snapshot(cs: list[pb.SnapshotChunk]) -> None:
        fuzz.snapshot([c.SerializeToString() for c in cs])

    @few
    @given(swims())
    def swim(m: pb.SwimMessage) -> None:
        fuzz.unary("Swim", pb.SwimMessage, m.SerializeToString())

    @few
    @given(hellos(fingerprint))
    def hello(h: pb.Hello) -> None:
        fuzz.unary("Hello", pb.Hello, h.SerializeToString())

    @few
    @given(st.builds(pb.PullModelRequest, protocol_version=U32, requester=TEXT))
    def pull_model(r: pb.PullModelRequest) -> None:
        fuzz.pull(r.SerializeToString())

    @few
    @given(st.binary(max_size=64))
    def status(raw: bytes) -> None:
        fuzz.unary("Status", pb.StatusRequest, raw)

    for run in (push_delta, stream_deltas, push_snapshot, swim, hello, pull_model, status):
        run()

    # Byte-level mutations of good messages.
    rng = random.Random(20261130)
    delta = good_delta(numel, 2).SerializeToString()
    chunk = good_snapshot(numel, 3).SerializeToString()
    assert target.peer.swim is not None
    swim_msg = wire.swim_to_pb(target.peer.swim.ping(target.node.address).message, PROTOCOL_VERSION)
    hello_msg = wire.hello_to_pb(
        Hello(PROTOCOL_VERSION, target.peer.swim.me, target.node.fingerprint, ())
    )
    pull = pb.PullModelRequest(protocol_version=PROTOCOL_VERSION, requester=PEER)
    for _ in range(MUTATIONS):
        fuzz.delta(mutate(rng, delta))
        fuzz.stream([delta, mutate(rng, delta)] if rng.random() < 0.5 else [mutate(rng, delta)])
        fuzz.snapshot([mutate(rng, chunk)])
        fuzz.unary("Swim", pb.SwimMessage, mutate(rng, swim_msg.SerializeToString()))
        fuzz.unary("Hello", pb.Hello, mutate(rng, hello_msg.SerializeToString()))
        fuzz.pull(mutate(rng, pull.SerializeToString()))
        fuzz.unary("Status", pb.StatusRequest, mutate(rng, b""))

    rss_growth = rss_bytes() - rss_before
    # Still serving: it answers, it counted what it refused, and a good delta applies on both.
    assert sum(target.rejected().values()) > rejected_before + EXAMPLES
    seq = target.node.state.replicas[PEER].seq
    assert control.node.state.replicas[PEER].seq == seq
    last = good_delta(numel, seq + 1)
    assert target.push_delta(last) == seq + 1
    assert control.push_delta(last) == seq + 1
    # The model and every replica, to the bit.
    assert torch.equal(target.node.flat.flat, control.node.flat.flat)
    assert target.node.state.replicas.keys() == control.node.state.replicas.keys()
    for peer_id, replica in target.node.state.replicas.items():
        assert torch.equal(replica.value, control.node.state.replicas[peer_id].value), peer_id
        assert replica.seq == control.node.state.replicas[peer_id].seq
    # Membership may have changed (a well-formed record is not bad input), but not our own.
    me = target.node.peers.swim.record(own)
    assert me is not None
    assert me.live
    assert me.address == target.node.address
    assert rss_growth < RSS_GROWTH_LIMIT, rss_growth


# -- the back-off -----------------------------------------------------------------------------


def test_a_peer_that_keeps_sending_bad_deltas_is_kept_out_until_its_ban_ends(
    loop: Loop, tmp_path: Path
) -> None:
    cfg = PenaltyConfig(threshold=4, window_s=60.0, ban_s=30.0, max_ban_s=120.0)
    live = start(loop, tmp_path, cfg)
    try:
        numel = live.node.flat.numel
        bad = good_delta(numel, 2)
        bad.payload.numel -= 1
        for _ in range(cfg.threshold):
            with pytest.raises(grpc.RpcError) as info:
                live.push_delta(bad)
            assert str(info.value.details()).startswith("bad_payload:")
        # Now even a good delta is refused at once, as banned, and counted so.
        with pytest.raises(grpc.RpcError) as info:
            live.push_delta(good_delta(numel, 2))
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert str(info.value.details()).startswith("banned:")
        assert live.rejected() == {"bad_payload": cfg.threshold, "banned": 1}
        assert live.node.state.replicas[PEER].seq == 1
        live.clock.advance(cfg.ban_s - 1.0)
        with pytest.raises(grpc.RpcError):
            live.push_delta(good_delta(numel, 2))
        live.clock.advance(1.0)
        assert live.push_delta(good_delta(numel, 2)) == 2
        # A repeat offence earns a ban twice as long.
        for _ in range(cfg.threshold):
            with pytest.raises(grpc.RpcError):
                live.push_delta(bad)
        assert live.node.service.penalties.ban_left_s(PEER) == 2 * cfg.ban_s
        # Refusals honest peers meet (a gap here) never count toward a ban.
        live.clock.advance(2 * cfg.ban_s)
        for _ in range(2 * cfg.threshold):
            with pytest.raises(grpc.RpcError) as info:
                live.push_delta(good_delta(numel, 9))
            assert str(info.value.details()).startswith("gap:")
        assert live.push_delta(good_delta(numel, 3)) == 3
    finally:
        live.channel.close()
        loop.run(_stop(live))
