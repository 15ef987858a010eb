"""Admission is the CA's: a member id enters a view only with a certificate of the swarm's CA
for it, checked once and within a budget per peer, off the event loop; an insider with one
valid certificate can speak for itself only, and what it may cost a node is bounded."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest

from gossip.clock import ManualClock
from gossip.swim import Kind, MemberRecord, SwimMessage
from node.daemon.node import Node
from node.security.identity import Identity, load_or_create_identity
from node.security.pki import CERT_FILE, TlsFiles, init_ca, issue_node, load_tls
from node.security.signing import MemberVerifier, RecordScreen, certificate_der
from node.transport.base import Reason, Rejected, Unreachable
from node.transport.grpc import GrpcTransport, GrpcTransportConfig
from tests.node.certs import build_cert, cert_pem, odd_tls, swarm_ca
from tests.node.helpers import config, fixed_identity, signed_record
from tests.node.helpers import poll as poll_async

CALL_TIMEOUT_S = 5.0


@dataclass
class Member:
    """A node's identity and certificate, issued by the test's CA."""

    identity: Identity
    tls: TlsFiles

    @property
    def node_id(self) -> str:
        return self.identity.node_id

    def record(self, address: str = "127.0.0.1:7001", incarnation: int = 1) -> MemberRecord:
        record = signed_record(self.identity, address, incarnation)
        return dataclasses.replace(record, certificate=certificate_der(self.tls.cert_pem))


def member(ca: Path, out: Path) -> Member:
    issue_node(ca, out, out.name)
    return Member(load_or_create_identity(out), load_tls(out))


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    init_ca(tmp_path / "ca")
    return tmp_path / "ca"


def ca_pem(ca: Path) -> bytes:
    return cert_pem(swarm_ca(ca)[0])


# -- the check ------------------------------------------------------------------------------


def test_a_record_with_a_certificate_of_the_swarms_ca_is_admitted_and_checked_once(
    ca: Path, tmp_path: Path
) -> None:
    a = member(ca, tmp_path / "a")
    verifier = MemberVerifier(ca_pem(ca))
    record = a.record()
    assert verifier(record)
    assert verifier(record)
    assert verifier.verified == 1  # the second time is a look-up
    assert verifier.certificates is not None
    assert verifier.certificates.checked == 1
    # A newer record of the same member costs one signature, not another certificate check.
    assert verifier(a.record(incarnation=2))
    assert verifier.verified == 2
    assert verifier.certificates.checked == 1
    assert verifier.counts["unadmitted"] == 0


def test_records_without_proof_of_a_certificate_for_their_id_are_dropped_and_counted(
    ca: Path, tmp_path: Path
) -> None:
    a = member(ca, tmp_path / "a")
    init_ca(tmp_path / "other-ca")
    stranger = member(tmp_path / "other-ca", tmp_path / "stranger")
    sybil = fixed_identity(99)  # a key of the insider's own making
    sybil_record = signed_record(sybil, "127.0.0.1:7002")
    old_cert = build_cert(sybil.key, *swarm_ca(ca), days=1)
    expired = dataclasses.replace(sybil_record, certificate=certificate_der(cert_pem(old_cert)))
    odd = {kind: odd_tls(ca, kind) for kind in ("rsa", "p384", "sub-ca")}
    forged = [
        sybil_record,  # no certificate at all
        dataclasses.replace(sybil_record, certificate=certificate_der(a.tls.cert_pem)),  # a's
        stranger.record(),  # a certificate of another CA
        dataclasses.replace(a.record(), address="10.6.6.6:7070"),  # moved after signing
        dataclasses.replace(a.record(), certificate=b"not DER at all"),
        *(
            dataclasses.replace(sybil_record, certificate=certificate_der(t.cert_pem))
            for t in odd.values()
        ),
    ]
    verifier = MemberVerifier(ca_pem(ca))
    for record in forged:
        assert not verifier(record), record
        assert verifier.blameworthy(record)
    assert verifier.counts["unadmitted"] == len(forged)
    # A certificate out of its time is refused too, but is no proof of bad faith: clocks differ.
    later = datetime.now(UTC) + timedelta(days=2)
    assert verifier.certificates is not None
    assert verifier.certificates.node_id(expired.certificate) == sybil.node_id
    with pytest.raises(ValueError, match="expired"):
        verifier.certificates.node_id(expired.certificate, now=later)


def test_without_a_ca_a_key_and_its_signature_are_all_there_is(tmp_path: Path) -> None:
    verifier = MemberVerifier(None)  # plain TCP: no admission
    record = signed_record(fixed_identity(5), "127.0.0.1:7003")
    assert verifier(record)
    assert not verifier(dataclasses.replace(record, incarnation=2))  # the signature no longer holds


# -- the screen -----------------------------------------------------------------------------


class ThreadNoting(MemberVerifier):
    """Notes the threads its full checks ran on."""

    threads: set[str]

    def check(self, record: MemberRecord) -> bool:
        self.threads = {*getattr(self, "threads", set()), threading.current_thread().name}
        return super().check(record)


async def test_the_screen_checks_off_the_event_loop_within_each_peers_budget(
    ca: Path, tmp_path: Path
) -> None:
    a = member(ca, tmp_path / "a")
    clock = ManualClock()
    verifier = ThreadNoting(ca_pem(ca))
    screen = RecordScreen(verifier, clock, rate=1.0, burst=5.0)
    try:
        records = [a.record(incarnation=i) for i in range(1, 21)]  # each needs a signature check
        got = await screen.screen("mallory", records)
        assert len(got.records) == 5
        assert got.over_budget == 15
        assert got.blamed == 0
        assert verifier.verified == 5
        assert threading.current_thread().name not in verifier.threads
        # What was checked is now free; the budget comes back with time; peers have their own.
        assert all(verifier.verdict(r) for r in got.records)
        again = await screen.screen("mallory", records)
        assert (len(again.records), again.over_budget) == (5, 15)
        clock.advance(3.0)
        assert len((await screen.screen("mallory", records)).records) == 8
        assert len((await screen.screen("bob", records)).records) == 13
        # What this node asked for (a hello's answer) is checked whole.
        assert len((await screen.screen("mallory", records, budgeted=False)).records) == 20
        # Forgeries cost no budget when their shape refuses them, and are blamed on the peer.
        sybils = [signed_record(fixed_identity(100 + i), "127.0.0.1:7004") for i in range(50)]
        got = await screen.screen("mallory", sybils)
        assert (len(got.records), got.over_budget, got.blamed) == (50, 0, 50)
    finally:
        screen.close()


# -- a live node ----------------------------------------------------------------------------


@dataclass
class Live:
    node: Node
    ca: Path
    tmp: Path

    def client(self, tls: TlsFiles) -> GrpcTransport:
        return GrpcTransport(GrpcTransportConfig(tls=tls))


@pytest.fixture
async def live(ca: Path, tmp_path: Path) -> AsyncIterator[Live]:
    issue_node(ca, tmp_path / "node", "node")
    # Waits for a member that never comes: it serves, but neither trains nor gossips.
    cfg = config(tmp_path / "node", insecure=False, wait_members=3, wait_timeout_s=None)
    node = await Node.create(cfg)
    await node.start()
    yield Live(node, ca, tmp_path)
    await node.stop(grace_s=0)


def ping(sender: Member, updates: tuple[MemberRecord, ...]) -> SwimMessage:
    own = sender.record()
    return SwimMessage(Kind.PING, sender.node_id, own.address, 1, updates=(own, *updates))


async def test_an_insider_speaks_for_itself_only_and_is_banned_for_forgeries(live: Live) -> None:
    mallory = member(live.ca, live.tmp / "mallory")
    client = live.client(mallory.tls)
    node = live.node
    try:
        sybils = tuple(
            signed_record(fixed_identity(200 + i), f"127.0.0.1:{7100 + i}") for i in range(30)
        )
        pasted = tuple(
            dataclasses.replace(r, certificate=certificate_der(mallory.tls.cert_pem))
            for r in sybils
        )
        threshold = node.transport.penalties.cfg.threshold  # type: ignore[attr-defined]
        for i in range(threshold):
            batch = sybils if i % 2 else pasted
            await client.call_swim(node.address, ping(mallory, batch), CALL_TIMEOUT_S)
        known = {r.node_id for r in node.peers.swim.records()}
        assert known == {node.node_id, mallory.node_id}  # mallory itself is a member
        # Each dropped and counted (a membership layer that limits new members per relayer may
        # drop some before they are even checked).
        assert len(sybils) <= node.counters.rejected["unadmitted"] <= threshold * len(sybils)
        with pytest.raises(Rejected) as info:
            await client.call_swim(node.address, ping(mallory, ()), CALL_TIMEOUT_S)
        assert info.value.reason is Reason.BANNED
        with pytest.raises(Rejected) as info:  # every call, not only membership
            await client.call_status(node.address, CALL_TIMEOUT_S)
        assert info.value.reason is Reason.BANNED
    finally:
        await client.close(0)


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("rsa", "its key is RSA-2048"),
        ("p384", "its key is ECDSA P-384"),
        ("sub-ca", "it is a CA certificate"),
        ("sub-ca-leaf", "not issued by the swarm's CA itself"),
    ],
)
async def test_certificates_a_node_cannot_hold_get_a_refusal_that_names_the_reason(
    live: Live, kind: str, words: str
) -> None:
    client = live.client(odd_tls(live.ca, kind))
    try:
        with pytest.raises((Rejected, Unreachable)) as info:
            await client.call_status(live.node.address, CALL_TIMEOUT_S)
    finally:
        await client.close(0)
    err = info.value
    if isinstance(err, Unreachable):
        # TLS itself may refuse a chain through a CA under the swarm's (its path length is 0).
        assert kind == "sub-ca-leaf"
        return
    assert isinstance(err, Rejected)
    assert err.reason is Reason.CERTIFICATE  # PERMISSION_DENIED with the reason, not UNKNOWN
    assert words in err.detail
    assert live.node.counters.rejected["certificate"] == 1


async def test_messages_in_another_nodes_name_get_the_certified_caller_banned(live: Live) -> None:
    mallory = member(live.ca, live.tmp / "mallory")
    client = live.client(mallory.tls)
    bob = member(live.ca, live.tmp / "bob")
    penalties = live.node.transport.penalties  # type: ignore[attr-defined]
    try:
        for _ in range(penalties.cfg.threshold):
            with pytest.raises(Rejected) as info:
                await client.call_swim(live.node.address, ping(bob, ()), CALL_TIMEOUT_S)
            assert info.value.reason is Reason.IDENTITY
        with pytest.raises(Rejected) as info:
            await client.call_swim(live.node.address, ping(mallory, ()), CALL_TIMEOUT_S)
        assert info.value.reason is Reason.BANNED
    finally:
        await client.close(0)
    assert penalties.ban_left_s(mallory.node_id) > 0
    assert penalties.ban_left_s(bob.node_id) == 0  # the one named is not the one punished


async def test_undecodable_messages_get_the_certified_caller_banned(live: Live) -> None:
    mallory = member(live.ca, live.tmp / "mallory")
    penalties = live.node.transport.penalties  # type: ignore[attr-defined]
    options = GrpcTransportConfig(tls=mallory.tls).channel_options()
    creds = grpc.ssl_channel_credentials(
        mallory.tls.ca_pem, mallory.tls.key_pem, mallory.tls.cert_pem
    )
    async with grpc.aio.secure_channel(live.node.address, creds, options=options) as channel:
        swim = channel.unary_unary(
            "/murmur.v1.Murmur/Swim",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        for _ in range(penalties.cfg.threshold):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await swim(b"\xff\xff\xff\xff", timeout=CALL_TIMEOUT_S)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await swim(b"", timeout=CALL_TIMEOUT_S)
        assert str(info.value.details()).startswith("banned:")
    assert penalties.ban_left_s(mallory.node_id) > 0


async def test_a_caller_holds_at_most_its_share_of_open_model_calls(live: Live) -> None:
    mallory = member(live.ca, live.tmp / "mallory")
    transport = live.node.transport
    assert isinstance(transport, GrpcTransport)
    limit = transport.cfg.model_calls_per_peer
    never = asyncio.Event()

    async def nothing() -> AsyncIterator[bytes]:  # a stream that stays open, sending nothing
        await never.wait()
        yield b""

    tls = mallory.tls
    creds = grpc.ssl_channel_credentials(tls.ca_pem, tls.key_pem, tls.cert_pem)
    options = GrpcTransportConfig(tls=tls).channel_options()
    async with grpc.aio.secure_channel(live.node.address, creds, options=options) as channel:
        open_stream = channel.stream_stream(
            "/murmur.v1.Murmur/StreamDeltas",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        held = [open_stream(nothing()) for _ in range(limit)]
        await poll(lambda: transport.open_calls(mallory.node_id) == limit, "open streams", 30.0)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await open_stream(nothing()).read()
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "calls open at once" in str(info.value.details())
        client = live.client(mallory.tls)
        try:  # calls that carry no model still go
            assert await client.call_status(live.node.address, CALL_TIMEOUT_S)
        finally:
            await client.close(0)
        for call in held:
            call.cancel()


async def poll(check: Callable[[], bool], what: str, timeout_s: float) -> None:
    async def ask() -> bool:
        return check()

    await poll_async(ask, what, timeout_s)


async def test_channels_to_addresses_a_node_is_given_are_bounded_and_expire(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    cfg = GrpcTransportConfig(control_channels=3, bulk_channels=2, control_idle_s=60.0)
    transport = GrpcTransport(cfg, clock)
    probe = SwimMessage(Kind.PING, "a" * 32, "127.0.0.1:9", 1)
    try:
        for port in range(20):  # nobody listens on these
            with pytest.raises(Unreachable):
                await transport.call_swim(f"127.0.0.1:{port + 1}", probe, 0.2)
        assert transport.channel_count() == 3
        clock.advance(61.0)  # the three go unused past the idle limit
        with pytest.raises(Unreachable):
            await transport.call_swim("127.0.0.1:30", probe, 0.2)
        assert transport.channel_count() == 1
    finally:
        await transport.close(0)
    assert transport.channel_count() == 0


async def test_a_nodes_own_records_carry_its_certificate(live: Live) -> None:
    own = live.node.peers.swim.me
    assert own.certificate == certificate_der((live.tmp / "node" / CERT_FILE).read_bytes())
    assert MemberVerifier(ca_pem(live.ca))(own)
