"""The one place that converts between protobuf messages and the core's dataclasses.

Decoding checks structure only (required parts present, sizes and strings within bounds) and
raises :class:`Rejected` with ``Reason.MALFORMED``; whether a message fits the receiver's state
is the handler's business.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from gossip.encoded import Encoded
from gossip.messages import (
    DIGEST_BYTES,
    Delta,
    Hello,
    ModelChunk,
    ParamSpec,
    SnapshotHeader,
    TaskFingerprint,
)
from gossip.swim import Kind, MemberRecord, Status, SwimMessage
from gossip.swim_messages import FULL_STATE, check_region
from node.security.revocation import MAX_BLOB_BYTES
from node.telemetry.status import NeighbourStatus, NodeStatus
from node.transport.base import Reason, Rejected, SnapshotChunk
from protos import murmur_pb2 as pb

__all__ = [
    "delta_from_pb",
    "delta_to_pb",
    "hello_from_pb",
    "hello_to_pb",
    "model_chunk_from_pb",
    "model_chunk_to_pb",
    "pb",
    "snapshot_chunk_from_pb",
    "snapshot_chunk_to_pb",
    "status_from_pb",
    "status_to_pb",
    "swim_from_pb",
    "swim_to_pb",
]

MAX_ID_CHARS = 128
MAX_ADDRESS_CHARS = 255
#: Members a hello may list: a swarm of thousands, far past what a view holds today; the message
#: size limit (set from the model) usually bites first.
MAX_MEMBERS = 4096
#: Updates a membership message may carry: an honest one carries its sender's record, the
#: receiver's if it is suspect, and ``max_piggyback`` (8 unless configured) updates.
MAX_SWIM_UPDATES = 32
#: A push-pull (and its reply) carries a full state, up to ``SwimConfig.max_push_pull`` (512
#: unless configured) records; the core keeps at most its own bound of them.
MAX_PUSH_PULL_UPDATES = 1024
MAX_PARAMS = 100_000
MAX_NUMEL = 1 << 40
MAX_PUBLIC_KEY_BYTES = 128  # an ECDSA P-256 key in DER is 91 bytes
MAX_SIGNATURE_BYTES = 96  # a DER ECDSA P-256 signature is at most 72 bytes
MAX_CERTIFICATE_BYTES = 2048  # a node certificate made by `murmur ca issue` is about 600 bytes
MAX_RELAYS = 4  # a member behind NAT names the members it holds dial-out sessions to
MAX_REVOCATION_BYTES = MAX_BLOB_BYTES
_ID_RE = re.compile(r"[A-Za-z0-9_.:\-]+")
_HOST_RE = re.compile(r"[A-Za-z0-9_.\-]+|\[[0-9A-Fa-f:.]+\]")


def _malformed(what: str) -> Rejected:
    return Rejected(Reason.MALFORMED, what)


def _node_id(value: str, what: str) -> str:
    if not value or len(value) > MAX_ID_CHARS or not _ID_RE.fullmatch(value):
        raise _malformed(f"{what} is not a valid node id")
    return value


def address(value: str, what: str = "address") -> str:
    """A dialable ``host:port`` (host a name, an IPv4 address or a bracketed IPv6 one)."""
    host, sep, port = value.rpartition(":")
    if (
        not sep
        or len(value) > MAX_ADDRESS_CHARS
        or not _HOST_RE.fullmatch(host)
        or not port.isdigit()
        or not 0 < int(port) < 65536
    ):
        raise _malformed(f"{what} {value[:MAX_ADDRESS_CHARS]!r} is not host:port")
    return value


_STATUS_TO_PB = {
    Status.ALIVE: pb.ALIVE,
    Status.SUSPECT: pb.SUSPECT,
    Status.DEAD: pb.DEAD,
    Status.LEFT: pb.LEFT,
}
_STATUS_FROM_PB = {v: k for k, v in _STATUS_TO_PB.items()}
_KIND_TO_PB = {
    Kind.PING: pb.PING,
    Kind.ACK: pb.ACK,
    Kind.PING_REQ: pb.PING_REQ,
    Kind.NACK: pb.NACK,
    Kind.PUSH_PULL: pb.PUSH_PULL,
    Kind.PUSH_PULL_REPLY: pb.PUSH_PULL_REPLY,
}
_KIND_FROM_PB = {v: k for k, v in _KIND_TO_PB.items()}


def _member_from_pb(m: pb.Member) -> MemberRecord:
    status = _STATUS_FROM_PB.get(m.status)
    if status is None:
        raise _malformed(f"member status {m.status} is unknown")
    if (
        len(m.public_key) > MAX_PUBLIC_KEY_BYTES
        or len(m.signature) > MAX_SIGNATURE_BYTES
        or len(m.certificate) > MAX_CERTIFICATE_BYTES
    ):
        raise _malformed("member key, signature or certificate is too long")
    if len(m.accuser_signature) > MAX_SIGNATURE_BYTES:
        raise _malformed("member accuser signature is too long")
    if len(m.relays) > MAX_RELAYS:
        raise _malformed(f"a member names more than {MAX_RELAYS} relays")
    return MemberRecord(
        _node_id(m.node_id, "member id"),
        address(m.address, "member address"),
        m.incarnation,
        status,
        m.public_key,
        m.signature,
        m.certificate,
        accuser=_node_id(m.accuser, "member accuser") if m.accuser else "",
        accuser_signature=m.accuser_signature,
        relays=tuple(address(r, "member relay") for r in m.relays),
        paused=m.paused,
        region=_region(m.region),
    )


def _region(name: str) -> str:
    try:
        return check_region(name)
    except ValueError as e:
        raise _malformed(f"member {e}") from None


def _member_to_pb(m: MemberRecord, certificate: bool = True) -> pb.Member:
    return pb.Member(
        node_id=m.node_id,
        address=m.address,
        incarnation=m.incarnation,
        status=_STATUS_TO_PB[m.status],
        public_key=m.public_key,
        signature=m.signature,
        certificate=m.certificate if certificate else b"",
        accuser=m.accuser,
        accuser_signature=m.accuser_signature,
        relays=m.relays,
        paused=m.paused,
        region=m.region,
    )


def _revocations(blob: bytes) -> bytes:
    if len(blob) > MAX_REVOCATION_BYTES:
        raise _malformed("the revocation list is too large")
    return blob


def _members_from_pb(
    members: Sequence[pb.Member], what: str, limit: int = MAX_MEMBERS
) -> tuple[MemberRecord, ...]:
    # Counted before any record is decoded, let alone checked.
    if len(members) > limit:
        raise _malformed(f"{what} lists more than {limit} members")
    return tuple(_member_from_pb(m) for m in members)


# -- hello ------------------------------------------------------------------------------------


def fingerprint_to_pb(f: TaskFingerprint) -> pb.TaskFingerprint:
    return pb.TaskFingerprint(
        params=[pb.ParamSpec(name=p.name, shape=list(p.shape), dtype=p.dtype) for p in f.params],
        codec=f.codec,
        block_size=f.block_size,
        fraction=f.fraction,
    )


def fingerprint_from_pb(f: pb.TaskFingerprint) -> TaskFingerprint:
    if len(f.params) > MAX_PARAMS:
        raise _malformed(f"fingerprint lists more than {MAX_PARAMS} parameters")
    params = []
    for p in f.params:
        if any(d < 0 for d in p.shape):
            raise _malformed(f"parameter {p.name!r} has a negative dimension")
        params.append(ParamSpec(p.name, tuple(p.shape), p.dtype))
    if not 0 <= f.fraction <= 1:  # NaN too
        raise _malformed(f"fingerprint fraction {f.fraction} is not in [0, 1]")
    return TaskFingerprint(tuple(params), f.codec, f.block_size, f.fraction)


def hello_to_pb(h: Hello) -> pb.Hello:
    return pb.Hello(
        protocol_version=h.protocol_version,
        self=_member_to_pb(h.self_),
        fingerprint=fingerprint_to_pb(h.fingerprint),
        members=[_member_to_pb(m) for m in h.members],
        revocations=h.revocations,
        unreachable=h.unreachable,
    )


def hello_from_pb(h: pb.Hello) -> Hello:
    if not h.HasField("self") or not h.HasField("fingerprint"):
        raise _malformed("hello needs self and fingerprint")
    return Hello(
        protocol_version=h.protocol_version,
        self_=_member_from_pb(h.self),
        fingerprint=fingerprint_from_pb(h.fingerprint),
        members=_members_from_pb(h.members, "hello"),
        revocations=_revocations(h.revocations),
        unreachable=h.unreachable,
    )


# -- membership -------------------------------------------------------------------------------


def swim_to_pb(m: SwimMessage, protocol_version: int) -> pb.SwimMessage:
    return pb.SwimMessage(
        protocol_version=protocol_version,
        kind=_KIND_TO_PB[m.kind],
        sender=m.sender,
        sender_address=m.sender_address,
        seq=m.seq,
        target=m.target,
        updates=[_member_to_pb(r) for r in m.updates],
        revocations=m.revocations,
    )


def swim_from_pb(m: pb.SwimMessage) -> tuple[int, SwimMessage]:
    """(protocol version, message)."""
    kind = _KIND_FROM_PB.get(m.kind)
    if kind is None:
        raise _malformed(f"swim message kind {m.kind} is unknown")
    target = _node_id(m.target, "target") if m.target else ""
    message = SwimMessage(
        kind,
        _node_id(m.sender, "sender"),
        address(m.sender_address, "sender address"),
        m.seq,
        target,
        _members_from_pb(
            m.updates,
            "swim message",
            MAX_PUSH_PULL_UPDATES if kind in FULL_STATE else MAX_SWIM_UPDATES,
        ),
        _revocations(m.revocations),
    )
    return m.protocol_version, message


# -- model transfer ---------------------------------------------------------------------------


def model_chunk_to_pb(c: ModelChunk) -> pb.ModelChunk:
    return pb.ModelChunk(numel=c.numel, offset=c.offset, data=c.data, step=c.step, same=c.same)


def model_chunk_from_pb(c: pb.ModelChunk) -> ModelChunk:
    if c.numel > MAX_NUMEL:
        raise _malformed("model numel is out of range")
    if c.same and (c.data or c.offset):
        raise _malformed("a chunk that says the model is the same carries no values")
    return ModelChunk(c.numel, c.offset, c.data, c.step, c.same)


def _digest(value: bytes, what: str) -> bytes:
    if value and len(value) != DIGEST_BYTES:
        raise _malformed(f"{what} of {len(value)} bytes is not a SHA-256 digest")
    return value


# -- deltas -----------------------------------------------------------------------------------


def delta_to_pb(d: Delta) -> pb.Delta:
    p = d.payload
    return pb.Delta(
        protocol_version=d.protocol_version,
        sender=d.sender,
        session=d.session,
        seq=d.seq,
        step=d.step,
        degree=d.degree,
        payload=pb.EncodedTensor(
            codec=p.codec, numel=p.numel, block_size=p.block_size, scales=p.scales, data=p.data
        ),
    )


def delta_from_pb(d: pb.Delta) -> Delta:
    if not d.HasField("payload"):
        raise _malformed("delta has no payload")
    p = d.payload
    if p.numel > MAX_NUMEL:
        raise _malformed("delta numel is out of range")
    return Delta(
        sender=_node_id(d.sender, "sender"),
        session=d.session,
        seq=d.seq,
        step=d.step,
        payload=Encoded(p.codec, p.numel, p.block_size, p.scales, p.data),
        degree=d.degree,
        protocol_version=d.protocol_version,
    )


# -- snapshots --------------------------------------------------------------------------------


def snapshot_chunk_to_pb(header: SnapshotHeader, chunk: SnapshotChunk) -> pb.SnapshotChunk:
    return pb.SnapshotChunk(
        protocol_version=header.protocol_version,
        sender=header.sender,
        session=header.session,
        seq=header.seq,
        numel=header.numel,
        degree=header.degree,
        offset=chunk.offset,
        data=chunk.data,
        digest=header.digest,
    )


def snapshot_chunk_from_pb(c: pb.SnapshotChunk) -> tuple[SnapshotHeader, SnapshotChunk]:
    if c.numel > MAX_NUMEL:
        raise _malformed("snapshot numel is out of range")
    header = SnapshotHeader(
        _node_id(c.sender, "sender"),
        c.session,
        c.seq,
        c.numel,
        c.degree,
        c.protocol_version,
        _digest(c.digest, "a snapshot's digest"),
    )
    if header.digest and (c.data or c.offset):
        raise _malformed("a snapshot that names its model by digest carries no values")
    return header, SnapshotChunk(c.offset, c.data)


# -- status -----------------------------------------------------------------------------------


_NESTED = ("neighbours", "members", "rejected", "member_counts")
_SCALARS = [f.name for f in dataclasses.fields(NodeStatus) if f.name not in _NESTED]
_NEIGHBOUR_FIELDS = [f.name for f in dataclasses.fields(NeighbourStatus)]


def status_to_pb(s: NodeStatus) -> pb.NodeStatus:
    return pb.NodeStatus(
        **{name: getattr(s, name) for name in _SCALARS},
        neighbours=[pb.NeighbourStatus(**dataclasses.asdict(n)) for n in s.neighbours],
        # Certificates are for nodes, and would make a status of many members large.
        members=[_member_to_pb(m, certificate=False) for m in s.members],
        rejected=s.rejected,
        member_counts=s.member_counts,
    )


def status_from_pb(s: pb.NodeStatus) -> NodeStatus:
    return NodeStatus(
        **{name: getattr(s, name) for name in _SCALARS},
        neighbours=tuple(
            NeighbourStatus(**{name: getattr(n, name) for name in _NEIGHBOUR_FIELDS})
            for n in s.neighbours
        ),
        members=tuple(
            MemberRecord(
                m.node_id,
                m.address,
                m.incarnation,
                _STATUS_FROM_PB[m.status],
                m.public_key,
                m.signature,
                accuser=m.accuser,
                accuser_signature=m.accuser_signature,
                relays=tuple(m.relays),
                paused=m.paused,
                region=m.region,
            )
            for m in s.members
        ),
        rejected=dict(s.rejected),
        member_counts=dict(s.member_counts),
    )
